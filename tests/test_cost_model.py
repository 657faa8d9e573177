"""One cost model for every schedule (issue 23, item 5): a `pl.Costs` is a rank's worth of layers,
which `simulate` divides over a schedule's stages; `pl.Costs.per_stage` is the explicit table."""
import pytest

import pipelab as pl
from pipelab.schedules.actions import Compound
from pipelab.sim.timeline import Event, Timeline
from pipelab.sim import costs as costs_module
from pipelab.sim import simulate as simulate_module
from pipelab.sim.tensor_overlap import bubbles

UNIT = pl.Costs(F=1, I=1, W=1)


def events(tl) -> list[tuple[str, float, float]]:
    return sorted((str(e.action), e.start, e.end) for e in tl.events)


def test_costs_live_in_their_own_module_and_keep_their_names():
    assert pl.Costs is costs_module.Costs is simulate_module.Costs


@pytest.mark.parametrize("name,options,makespan", [
    ("1f1b", {}, 33.0),                      # (m + p − 1)(F + I + W)
    ("interleaved-1f1b", {"chunks": 2}, 28.5),   # m·3 + (p − 1)·3 / v
    ("zb-v", {}, 25.5),                      # the V at unit costs (docs/formulas.md)
])
def test_one_object_compares_every_schedule(name, options, makespan):
    """p=4, m=8, unit costs for a rank's worth of layers: the papers' reference values."""
    sched = pl.schedule(name, ranks=4, microbatches=8, **options)
    assert pl.simulate(sched, UNIT).makespan == makespan


@pytest.mark.parametrize("name,options,m,old", [
    ("1f1b", {}, 8, 33.0), ("interleaved-1f1b", {"chunks": 2}, 8, 57.0), ("zb-v", {}, 8, 51.0),
    ("interleaved-1f1b", {"chunks": 2}, 16, 105.0), ("zb-v", {}, 16, 99.0),   # issue 23's
])
def test_the_per_stage_form_gives_the_old_per_stage_numbers(name, options, m, old):
    """What `pl.Costs(F=1, I=1, W=1)` gave before it meant a rank's worth (every stage 1):
    twice the work on a schedule of two stages per rank, so twice the step without messages
    (at m=16, 2 × 52.5 and 2 × 49.5: the issue's 105 and 99)."""
    sched = pl.schedule(name, ranks=4, microbatches=m, **options)
    per_stage = pl.simulate(sched, pl.Costs.per_stage(F=1, I=1, W=1))
    assert per_stage.makespan == old
    doubled = pl.simulate(sched, pl.Costs(F=2, I=2, W=2)) if sched.stages > sched.ranks else \
        pl.simulate(sched, UNIT)
    assert events(per_stage) == events(doubled)


@pytest.mark.parametrize("name,share", [
    ("1f1b", 1.0), ("interleaved-1f1b", 0.5), ("zb-v", 0.5), ("dualpipe-v", 0.5),
    ("dualpipe", 1.0), ("chimera", 1.0),     # weight replicas: each stage a whole rank's worth
])
def test_a_rank_divides_its_worth_over_its_stages(name, share):
    sched = pl.schedule(name, ranks=4, microbatches=8)
    by_rank = pl.simulate(sched, pl.Costs(F=1.0, I=1.5, W=0.5, comm=0.25))
    by_stage = pl.simulate(sched, pl.Costs.per_stage(F=share, I=1.5 * share, W=0.5 * share,
                                                     comm=0.25))      # messages not divided
    assert events(by_rank) == events(by_stage)


def test_per_rank_lists_follow_the_placement():
    vee = pl.schedule("zb-v", ranks=2, microbatches=4)                  # stages 0 1 | 1 0
    by_rank = pl.simulate(vee, pl.Costs(F=[2.0, 4.0], I=[2.0, 6.0], W=1.0))
    by_stage = pl.simulate(vee, pl.Costs.per_stage(F=[1.0, 2.0, 2.0, 1.0],
                                                   I=[1.0, 3.0, 3.0, 1.0], W=0.5))
    assert events(by_rank) == events(by_stage)


def test_divided_amounts_include_all_reduces_and_gradient_bytes():
    """T_AR and a stage's gradient bytes are a rank's worth too; latency and bandwidth are not."""
    sched = pl.schedule("zb-v", ranks=2, microbatches=4)
    by_rank = pl.Costs(F=1, I=1, W=1, tp_allreduce=0.5)
    by_stage = pl.Costs.per_stage(F=0.5, I=0.5, W=0.5, tp_allreduce=0.25)
    a, b = pl.simulate(sched, by_rank), pl.simulate(sched, by_stage)
    assert events(a) == events(b)
    assert bubbles(a, by_rank) == bubbles(b, by_stage)          # looked up per stage alike
    dp = pl.with_data_parallel(sched, 2)
    link = dict(bandwidth=1000.0, latency=0.5)
    assert events(pl.simulate(dp, pl.Costs(parameter_bytes=[2000.0, 4000.0], **link))) == events(
        pl.simulate(dp, pl.Costs.per_stage(F=0.5, I=0.5, W=0.5,
                                           parameter_bytes=[1000.0, 2000.0, 2000.0, 1000.0],
                                           **link)))


def test_lists_of_the_wrong_length_name_the_rule():
    loop = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    with pytest.raises(ValueError, match=r"Costs.F has 4 values.*one per rank \(2\).*per_stage"):
        pl.simulate(loop, pl.Costs(F=[1.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"Costs.I has 2 values.*one per stage \(4"):
        pl.simulate(loop, pl.Costs.per_stage(I=[1.0, 1.0]))
    with pytest.raises(ValueError, match=r"Costs.kinds\['R'\] has 3 values"):
        pl.simulate(loop, pl.Costs(kinds={"R": [1.0, 1.0, 1.0]}))
    with pytest.raises(ValueError, match="Costs.scope must be 'rank'"):
        pl.Costs(scope="chunk")
    with pytest.raises(ValueError, match="per_stage sets scope"):
        pl.Costs.per_stage(scope="rank")


def test_measured_and_partition_tables_are_per_stage():
    """A fit of a V's timeline is per stage: simulated again it gives the same step (a rank's
    worth would be divided a second time). A partition's loads are each stage's own."""
    vee = pl.schedule("zb-v", ranks=2, microbatches=4)
    tl = pl.simulate(vee, pl.Costs(F=[1.0, 2.0], I=1.0, W=0.5))
    fitted = pl.Costs.fit(tl, vee.stages)
    assert events(pl.simulate(vee, fitted)) == events(tl)
    cfg = pl.ModelConfig(n_layers=6, d_model=32, n_heads=4, seq_len=16)
    part = pl.partition(cfg, stages=4)
    loop = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    forward = {e.action.stage: e.duration for e in pl.simulate(loop, part.costs()).events
               if e.action.kind == "F"}
    assert forward == pytest.approx({s: f / 1e6 for s, f in enumerate(part.loads())})


def test_chunk_costs_is_the_table_simulate_runs_on():
    from pipelab.sim import compare
    loop = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    assert events(pl.simulate(loop, compare.chunk_costs(UNIT, loop))) == \
        events(pl.simulate(loop, UNIT))
    with pytest.raises(ValueError, match="rank's worth"):
        compare.chunk_costs(pl.Costs.per_stage(F=1.0), loop)


def test_fit_counts_a_doubled_forward_as_two_forwards_and_leaves_pairs_out():
    # Chimera's forward doubling runs every forward as one compound step 0F0+0F1: the fit
    # reads each as two forwards of half its time (else F would fit to 0 and a replay of a
    # doubled run would have free forwards); DualPipe's F&B pairs mix passes and stay out.
    f0, f1 = pl.Action(0, "F", 0), pl.Action(0, "F", 1)
    b0, b1 = pl.Action(0, "B", 0), pl.Action(0, "B", 1)
    events = [Event(0, Compound((f0, f1)), 0.0, 4.0), Event(0, b0, 4.0, 7.0),
              Event(0, Compound((pl.Action(0, "F", 2), b1)), 7.0, 17.0)]
    fitted = pl.Costs.fit(Timeline(events, ranks=1), stages=1)
    assert fitted.F == [2.0] and fitted.B == [3.0]
