"""The open core: kinds registered once, compound steps, step-wide actions, collectives,
numbered transfers, the cost table, and kinds defined outside pipelab reaching the workers."""
from __future__ import annotations

import pytest

import pipelab as pl
import pipelab_test_kinds  # noqa: F401 - registers the SY collective (and its handler)
from pipelab.runtime import register_handler
from pipelab.runtime.handlers import HANDLERS
from pipelab.schedules import (KIND_SPECS, NO_MICROBATCH, Action, Compound, Input, Schedule,
                               ScheduleError, comm_plan, register_kind)
from pipelab.sim.timeline import Event, Timeline

CFG = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16)


def one_f_one_b_with_pairs() -> Schedule:
    """1F1B on 2 ranks, 4 microbatches, rank 0's steady-state F and B joined into pairs."""
    return Schedule.from_text("0F0 0F1+0B0 0F2+0B1 0F3+0B2 0B3\n"
                              "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3")


# --- the language ----------------------------------------------------------------------------

def test_compound_and_step_wide_actions_round_trip_as_text():
    pair = Action.parse("3F5+4B0")
    assert isinstance(pair, Compound) and pair.parts == (Action(3, "F", 5), Action(4, "B", 0))
    assert str(pair) == "3F5+4B0" and pair.kind == "F+B"
    sync = Action.parse("0SY")
    assert sync == Action(0, "SY", NO_MICROBATCH) and str(sync) == "0SY"
    with pytest.raises(ValueError, match="takes no microbatch"):
        Action.parse("0SY3")
    with pytest.raises(ValueError, match="needs a microbatch"):
        Action.parse("1F")


def test_compound_schedule_survives_text_and_csv(tmp_path):
    sched = one_f_one_b_with_pairs().validate()
    assert Schedule.from_text(sched.to_text()).actions == sched.actions
    assert Schedule.from_csv(sched.to_csv()).actions == sched.actions
    assert "0F1+0B0" in str(sched)


def test_a_part_of_a_compound_is_not_also_run_alone():
    with pytest.raises(ScheduleError, match="0B0 appears twice"):
        Schedule.from_text("0F0 0F1+0B0 0B0 0B1\n1F0 1B0 1F1 1B1").validate()


def test_compound_waits_for_the_inputs_of_every_part():
    # 0F1+0B0 cannot start before 1B0's gradient arrives, although 0F1 alone could.
    tl = pl.simulate(one_f_one_b_with_pairs(), pl.Costs(F=1, I=1, W=1))
    pair = next(e for e in tl.events if str(e.action) == "0F1+0B0")
    grad = next(e for e in tl.events if str(e.action) == "1B0")
    assert pair.start == grad.end and pair.duration == 3.0      # F + (I + W), one box


def test_a_compound_is_drawn_as_one_box_in_its_parts_colours():
    import matplotlib
    matplotlib.use("Agg")
    from pipelab.views.plots import kind_colour
    from matplotlib.colors import to_rgba
    tl = pl.simulate(one_f_one_b_with_pairs())
    ax = tl.plot()
    pair = next(e for e in tl.events if str(e.action) == "0F1+0B0")
    bar = ax.pipelab_bars[pair]
    (overlay,) = bar.pipelab_overlays
    assert bar.get_facecolor() == to_rgba(kind_colour("F"))
    assert overlay.get_facecolor() == to_rgba(kind_colour("B"))
    assert ax.pipelab_labels[pair].get_text() == "1/0"


# --- collectives -------------------------------------------------------------------------------

def test_a_member_that_never_reaches_a_collective_is_named():
    with pytest.raises(ScheduleError) as info:
        Schedule.from_text("0F0 0B0 0SY\n1F0 1B0", placement=[0, 1]).validate()
    assert "rank 1 never reaches 0SY" in str(info.value) and "step |" in str(info.value)


def test_a_collective_deadlock_names_who_never_arrives():
    with pytest.raises(ScheduleError) as info:
        Schedule.from_text("0SY 0F0 0B0\n1F0 0SY 1B0", placement=[0, 1]).validate()
    message = str(info.value)
    assert "rank 0 waits in 0SY" in message and "rank 1 is stuck before it, at 1F0" in message


def test_a_collective_starts_when_every_member_is_free():
    sched = Schedule.from_text("0F0 0SY 0B0\n1F0 1B0 0SY", placement=[0, 1]).validate()
    tl = pl.simulate(sched, pl.Costs(F=1, I=1, W=1))
    syncs = [e for e in tl.events if e.action.kind == "SY"]
    assert sorted(e.rank for e in syncs) == [0, 1]
    # rank 0 reaches 0SY at 1, but rank 1 is busy with 1F0 and 1B0 until 4: both start then.
    assert {(e.start, e.end) for e in syncs} == {(4.0, 4.25)}
    assert next(e for e in tl.events if str(e.action) == "0B0").start == 4.25


def test_data_parallel_refuses_a_schedule_with_collectives_of_its_own():
    sched = Schedule.from_text("0F0 0SY 0B0\n1F0 1B0 0SY", placement=[0, 1])
    with pytest.raises(ValueError, match="collectives of its own"):
        pl.runtime.prepare_run(sched, ranks=4, data_parallel=2)


# --- communication -----------------------------------------------------------------------------

def test_every_transfer_has_its_own_tag_even_with_thousands_of_stages():
    sched = pl.schedule("gpipe", ranks=4100, microbatches=1)      # the old tags collided here
    plan = comm_plan(sched)
    sends = [t for steps in plan for s in steps for t in s.send]
    recvs = [t for steps in plan for s in steps for t in s.recv]
    assert len({t.tag for t in sends}) == len(sends) == 2 * 4099
    assert {t.tag for t in recvs} == {t.tag for t in sends}
    assert {t.what for t in sends} == {"activation", "input gradient"}


def test_co_located_stages_hand_over_in_memory():
    sched = Schedule.from_text("0F0 1F0 1B0 0B0", placement=[0, 0]).validate()
    (steps,) = comm_plan(sched)
    assert all(not s.send and not s.recv for s in steps)
    assert steps[0].keep == {Action(0, "F", 0): 1} and steps[2].keep == {Action(1, "B", 0): 1}


# --- the cost table ----------------------------------------------------------------------------

def test_costs_is_a_table_by_kind_and_stage():
    costs = pl.Costs(F=[1, 2], I=1, W=[0.5, 0.25], B=[3, 3], kinds={"SY": 0.1})
    assert costs.of("B", 0) == 3 and costs.of("I", 1) == 1 and costs.of("SY", 1) == 0.1
    assert pl.Costs(F=1, I=1.5, W=0.5).of("B", 0) == 2.0           # derived: I + W
    assert pl.Costs().of("SY", 0) == 0.25                          # the kind's own rule
    assert costs.duration(Action.parse("0F1+1B0")) == 1 + 3
    register_kind("Zz", "a kind with no cost rule", module="tests")
    with pytest.raises(ValueError, match="no cost for action kind 'Zz'"):
        pl.Costs().of("Zz", 0)
    with pytest.raises(ValueError, match=r"Costs.kinds\['SY'\] must be a finite number"):
        pl.Costs(kinds={"SY": float("nan")})
    # per-stage lists of plain floats take a fast path: it must refuse what the slow one does
    for bad in ([1.0, float("nan"), 2.0], [2.0, -0.5], [1.0, float("inf")], [0.5, -0.0 - 1e-300]):
        with pytest.raises(ValueError, match=r"Costs.F must be a finite number"):
            pl.Costs.per_stage(F=bad, I=1.0, W=1.0)
    assert pl.Costs.per_stage(F=[1.0, 0.0], I=[1, 2], W=1.0).I == [1.0, 2.0]


def test_fit_does_not_double_count_a_stage_that_mixes_b_with_i_and_w():
    a = Action
    events = [Event(0, a(0, "F", 0), 0, 1), Event(0, a(0, "B", 0), 1, 3),
              Event(0, a(0, "F", 1), 3, 4), Event(0, a(0, "I", 1), 4, 5),
              Event(0, a(0, "W", 1), 5, 6)]
    fitted = pl.Costs.fit(Timeline(events, 1, source="measured"), stages=1)
    assert (fitted.of("F", 0), fitted.of("I", 0), fitted.of("W", 0)) == (1, 1, 1)
    assert fitted.of("B", 0) == 2
    only_b = pl.Costs.fit(Timeline(events[:2], 1, source="measured"), stages=1)
    assert (only_b.of("I", 0), only_b.of("W", 0), only_b.of("B", 0)) == (1, 1, 2)


def test_a_kinds_memory_effect_reaches_the_simulator():
    register_kind("Hx", "holds half a forward's activations until the step ends",
                  memory=+0.5, cost=lambda costs, stage: 1.0, module="tests")
    sched = Schedule.from_text("0F0 0Hx0 0B0").validate()
    peak = pl.simulate(sched, pl.Costs()).peak_activations()[0]
    assert peak == 1.5
    del KIND_SPECS["Hx"]


# --- the runtime -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    with pl.LocalCluster(2, timeout=30) as c:
        yield c


def test_compound_steps_run_live_and_exactly(cluster):
    res = cluster.run(one_f_one_b_with_pairs(), model=CFG)
    assert res.max_grad_error <= 1e-5
    assert any(str(e.action) == "0F1+0B0" for e in res.timeline.events)


def test_send_buffers_are_counted_apart_from_activations(cluster):
    m = 4
    res = cluster.run(pl.schedule("gpipe", ranks=2, microbatches=m), model=CFG)
    boundary = res.spec.rows_per_microbatch * CFG.seq_len * CFG.d_model * 4     # float32 bytes
    # Sends are waited on at the end of the step (a gloo send completes only when the peer
    # posts its receive), so each rank holds every message it sent until then.
    assert res.send_buffer_peak == {0: m * boundary, 1: m * boundary}
    assert "peak send buffers" in res.table()


def test_a_collective_from_a_user_module_runs_on_every_member(cluster):
    sched = Schedule.from_text("0F0 0B0 0SY\n1F0 1B0 0SY", placement=[0, 1]).validate()
    res = cluster.run(sched, model=CFG)
    # the kinds' module, and the test technique that rides with SY when it is registered
    assert res.spec.plugins[0] == "pipelab_test_kinds"
    assert set(res.spec.plugins) <= {"pipelab_test_kinds", "pipelab_test_technique"}
    assert sorted(e.rank for e in res.timeline.events if e.action.kind == "SY") == [0, 1]
    assert res.max_grad_error <= 1e-5


STUCK = "0F0 0SY 0B0\n1F0 1B0 0SY"      # rank 1 never reaches the collective rank 0 waits in


def test_a_stuck_collective_names_the_member_that_never_came(cluster):
    sched = Schedule.from_text(STUCK, placement=[0, 1]).validate()
    # 1B0 stalls for ever, so the run cannot finish whatever the load; the timeout only has to
    # outlast a descheduled rank 0 on its way to 0SY (2 s did not, twice, at load ~20)
    with pytest.raises(pl.PipelineTimeout) as info:
        cluster.run(sched, model=CFG, timeout=4, _inject={"stall": "1B0"})
    message = str(info.value)
    assert "rank 0 waits in 0SY" in message and "which rank 1 has not reached" in message
    assert info.value.rank == 1


@pytest.mark.parametrize("first", [0, 1])
def test_the_stuck_collective_is_explained_whichever_rank_stopped_first(first):
    """The watchdog on the board of the run above, with rank 0 reaching 0SY before or after
    rank 1 entered its stalled 1B0 (the OS decides which): the same explanation."""
    from pipelab.runtime.board import RUN, RankState
    from pipelab.runtime.watchdog import diagnose
    from pipelab.schedules.comm import comm_plan
    sched = Schedule.from_text(STUCK, placement=[0, 1]).validate()
    since = {first: 100.0, 1 - first: 100.5}
    states = [RankState(0, 0, 1, RUN, 0, since[0]), RankState(1, 0, 1, RUN, 0, since[1])]
    error = diagnose(states, sched, comm_plan(sched), 2.0, 110.0)
    assert "which rank 1 has not reached" in str(error) and error.rank == 1


def test_a_handler_defined_in_main_is_refused_before_any_worker_moves(cluster):
    def sync_here(state, action, inputs):
        return None
    sync_here.__module__ = "__main__"
    original = HANDLERS["SY"]
    try:
        register_handler("SY", replace=True)(sync_here)
        sched = Schedule.from_text("0F0 0B0 0SY\n1F0 1B0 0SY", placement=[0, 1])
        with pytest.raises(ValueError, match="handler for action kind 'SY' is defined in "
                                             "'__main__'.*cannot import"):
            cluster.run(sched, model=CFG)
    finally:
        HANDLERS["SY"] = original


def test_the_share_of_activations_i_frees_is_measured_not_assumed(cluster):
    split = cluster.run(pl.schedule("zb-h1", ranks=2, microbatches=4), model=CFG)
    full = cluster.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG)
    assert full.i_frees is None                  # no split backward, nothing to measure
    # I frees the graph but the weight-gradient store keeps each Linear's input and output
    # gradient for W: most of a stage's activations stay (weight_grad.py).
    assert 0.02 < split.i_frees < 0.5
    # The simulated view of the run uses it: rank 1's memory after its last I is not zero.
    rank1 = split.simulated.memory_curve(1)
    assert any(0 < level < 1 for _t, level in rank1)


def test_each_transfer_has_the_shape_and_dtype_its_producer_declares(cluster):
    sched = Schedule.from_text("0F0 0F1 0Lr0 0Lr1 0B0 0B1\n1F0 1Ls0 1F1 1Ls1 1B0 1B1").validate()
    (plan0, plan1) = comm_plan(sched)
    sent = [t for s in plan1 for t in s.send if t.producer.kind == "Ls"]
    assert [(str(t.producer), str(t.consumer), t.what) for t in sent] == \
        [("1Ls0", "0Lr0", "loss copy"), ("1Ls1", "0Lr1", "loss copy")]
    res = cluster.run(sched, model=CFG)      # Lr raises in the worker on a wrong message
    assert res.max_grad_error <= 1e-5


def test_a_kind_registered_again_is_validated_again():
    # A notebook cell run again with other inputs must not hide behind the validation cache.
    register_kind("Xq", "a step-wide test kind", per_microbatch=False, module="tests",
                  cost=lambda costs, stage: 0.0)
    sched = Schedule.from_text("0Xq 0F0 0B0\n1F0 1B0").validate()
    register_kind("Xq", "now it waits for stage 1's forward", per_microbatch=False,
                  module="tests", cost=lambda costs, stage: 0.0,
                  inputs=lambda schedule, a: [Input("after", Action(1, "F", 0), carries=False)])
    with pytest.raises(ScheduleError, match="deadlock"):
        sched.validate()
    del KIND_SPECS["Xq"]


def test_a_step_wide_action_on_one_rank_validates_and_is_costed():
    register_kind("Up", "optimizer update (test)", per_microbatch=False, module="tests",
                  cost=lambda costs, stage: 0.5)
    sched = Schedule.from_text("0F0 0B0 0Up\n1F0 1B0 1Up").validate()
    tl = pl.simulate(sched, pl.Costs(F=1, I=1, W=1))
    ends = {str(e.action): e.end for e in tl.events}
    assert ends["1Up"] == 4.5 and ends["0Up"] == 6.5 and tl.makespan == 6.5
    with pytest.raises(ScheduleError, match="0Up appears twice"):
        Schedule.from_text("0F0 0B0 0Up 0Up\n1F0 1B0 1Up").validate()
    del KIND_SPECS["Up"]
