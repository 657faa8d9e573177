"""The bulk way (schedules/bulk.py: a plain schedule ordered and timed with numpy) gives what the
step-by-step way gives, and the simulator benchmark's size still simulates to its closed form.

Nothing here is timed: the time is `benchmarks/simulate_speed.py`'s to print."""
import numpy as np
import pytest

import pipelab as pl
from pipelab.schedules import Schedule, ScheduleError, graph
from pipelab.schedules.bulk import plain_arrays, producer_rows
from pipelab.schedules.graph import execution_order, inputs_of


# Non-dyadic costs and a message cost, so a sum taken in another order would show; W = 0 puts
# two steps of one rank at the same instant (their order in the timeline is then the program's).
CASES = [("1f1b", 3, 7, pl.Costs(F=0.3, B=0.9, comm=0.37), 0.0),
         ("gpipe", 4, 5, pl.Costs(F=0.7, B=1.1, comm=0.1), 0.0),
         ("interleaved-1f1b", 2, 8, pl.Costs(F=1.0, B=2.0, comm=0.05), 0.0),
         ("zb-h1", 4, 9, pl.Costs(F=1.0, I=1.3, W=0.7, comm=0.1), 0.3),
         ("zb-v", 3, 6, pl.Costs(F=0.9, I=1.1, W=0.0), 0.6)]


@pytest.mark.parametrize("name,ranks,m,costs,i_frees", CASES, ids=[c[0] for c in CASES])
def test_the_bulk_way_simulates_exactly_what_the_step_by_step_way_does(
        name, ranks, m, costs, i_frees, monkeypatch):
    sched = pl.schedule(name, ranks=ranks, microbatches=m)
    assert execution_order(sched).waves is not None         # the bulk way, not a fallback
    fast = pl.simulate(sched, costs, i_frees=i_frees)
    monkeypatch.setattr(graph, "producer_rows", lambda schedule, plain: None)
    again = pl.schedule(name, ranks=ranks, microbatches=m)
    assert execution_order(again).waves is None
    slow = pl.simulate(again, costs, i_frees=i_frees)
    assert fast.events == slow.events                # same steps, times, ranks and order
    assert fast.memory == slow.memory
    assert pl.schedules.grid.unit_steps(sched) == pl.schedules.grid.unit_steps(again)


def _without_replica_sums(name: str) -> Schedule:
    """A schedule with routes whose actions are all plain: its replica sums taken out, its
    paired steps run one part after the other (its edges are what is compared, not its order)."""
    sched = pl.schedule(name, ranks=4, microbatches=8)
    kept = [[p for a in acts for p in a.parts if p.kind in "FBIW"] for acts in sched.actions]
    return Schedule(kept, sched.placement, sched.microbatches, routes=sched.routes,
                    slices=sched.slices)


@pytest.mark.parametrize("sched", [pl.schedule("zb-h2", ranks=3, microbatches=6),
                                   pl.schedule("1f1b", ranks=4, microbatches=4),
                                   _without_replica_sums("chimera")],
                         ids=["zb-h2", "1f1b", "chimera routes"])
def test_bulk_inputs_name_the_producers_each_kind_s_inputs_name(sched):
    """F, B, I and W's `bulk_inputs` against their `inputs`, action by action (I producing the
    input gradient through the index; the routes' first and last stages)."""
    plain = plain_arrays(sched)
    rows = producer_rows(sched, plain)
    assert rows is not None
    for action, made in zip(plain.flat, rows.tolist()):
        want = [edge.producer for edge in inputs_of(sched, action)]
        assert [plain.flat[p] for p in made if p >= 0] == want, action


def test_errors_still_come_from_the_step_by_step_checks():
    """A deadlock the bulk way finds goes back to the step-by-step pass, which says who waits
    for what; so does an action waiting for a later one of its own rank."""
    crossed = Schedule.from_text("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0")
    with pytest.raises(ScheduleError, match="deadlock: no rank can make progress"):
        crossed.validate()
    backwards = Schedule.from_text("0B0 0F0")
    with pytest.raises(ScheduleError, match=r"runs 0B0 at step 0, before 0F0 at step 1"):
        backwards.validate()


def test_the_benchmark_size_simulates_to_the_closed_form():
    """benchmarks/simulate_speed.py's 64 ranks x 1,024 microbatches of 1F1B: 2pm actions, all
    ordered in bulk, and the makespan of F=1, B=2 is 3(m + p - 1)."""
    p, m = 64, 1024
    sched = pl.schedule("1f1b", ranks=p, microbatches=m)
    assert len(sched) == 2 * p * m
    timeline = pl.simulate(sched, pl.Costs())
    assert sched.execution_order().waves is not None
    assert timeline.makespan == 3 * (m + p - 1)
    assert len(timeline.events) == 2 * p * m
    # every rank ends with no activations held, and rank 0 peaks at p of them
    assert all(timeline.memory_curve(r)[-1][1] == 0 for r in range(p))
    assert timeline.peak_activations()[0] == p
    assert np.isclose(timeline.bubble_fraction(), (p - 1) / (m + p - 1))


@pytest.fixture
def side_lane_kind():
    """A kind on the communication lane that the bulk way can order (it has `bulk_inputs`):
    it reads its (stage, microbatch)'s W. Removed again after the test."""
    from pipelab.schedules import Input, register_kind
    from pipelab.schedules.kinds import KIND_SPECS, KINDS, VERSION
    specs, names = dict(KIND_SPECS), dict(KINDS)
    register_kind("Qs", "a gradient send beside the compute (test)", lane="comm",
                  cost=lambda costs, stage: 0.45,
                  inputs=lambda s, a: [Input("grads", pl.schedules.Action(a[0], "W", a[2]), False)],
                  bulk_inputs=lambda s, table, stage, mb: [table.of("W", stage, mb)])
    yield "Qs"
    KIND_SPECS.clear(), KIND_SPECS.update(specs)
    KINDS.clear(), KINDS.update(names)
    VERSION[0] += 1


def test_a_kind_on_a_side_lane_is_timed_in_bulk_as_step_by_step(side_lane_kind, monkeypatch):
    """The lanes of the bulk timing: a step on the communication lane queues behind the one
    before it there, not behind the compute."""
    def build():                         # ZB-H1 with a send after each W
        base = pl.schedule("zb-h1", ranks=3, microbatches=6)
        rows = []
        for acts in base.actions:
            row = []
            for a in acts:
                row.append(a)
                if a[1] == "W":
                    row.append(pl.schedules.Action(a[0], side_lane_kind, a[2]))
            rows.append(row)
        return Schedule(rows, base.placement, base.microbatches)
    costs = pl.Costs(F=1.0, I=1.1, W=0.3, comm=0.2)
    sched = build()
    fast = pl.simulate(sched, costs)
    assert sched.execution_order().waves is not None
    monkeypatch.setattr(graph, "producer_rows", lambda schedule, plain: None)
    slow = pl.simulate(build(), costs)
    assert fast.events == slow.events
    sends = fast.side_events("comm")
    assert len(sends) == 3 * 6
    # somewhere a send overlaps the compute after it on its rank (it is on a lane of its own)
    assert any(e.end > f.start for e in sends for f in fast.events_of(e.rank)
               if f.action[1] != side_lane_kind and f.start >= e.start and f.start < e.end)
