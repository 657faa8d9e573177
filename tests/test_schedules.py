"""The schedule language: actions, text/CSV forms, the registry and the validator."""
import pytest

import pipelab as pl
from pipelab.schedules import Action, Schedule, ScheduleError, comm_plan

GENERATED = [(name, p, m) for name in ("gpipe", "1f1b") for p in (1, 2, 3, 4, 8) for m in (1, 2, 5, 8)]


def test_action_text_round_trips():
    for text in ("0F0", "1F3", "12B7", "3I0", "3W10"):
        assert str(Action.parse(text)) == text
    assert Action.parse("1F3") == Action(1, "F", 3)


@pytest.mark.parametrize("bad", ["F3", "1f3", "1X3", "", "1F", "a1F3"])
def test_action_parse_rejects_bad_text(bad):
    with pytest.raises(ValueError):
        Action.parse(bad)


@pytest.mark.parametrize("name,p,m", GENERATED)
def test_text_and_csv_round_trip(name, p, m, tmp_path):
    sched = pl.schedule(name, ranks=p, microbatches=m)
    again = Schedule.from_text(sched.to_text())
    assert again.actions == sched.actions and again.placement == sched.placement
    assert again.microbatches == m and again.name == name
    path = tmp_path / "s.csv"
    sched.to_csv(path)
    from_csv = Schedule.from_csv(path)
    assert from_csv.actions == sched.actions and from_csv.placement == sched.placement
    assert Schedule.from_csv(str(path)).actions == sched.actions
    assert Schedule.from_csv(sched.to_csv()).actions == sched.actions      # the text itself


def test_from_csv_reads_a_long_one_line_text():
    sched = pl.schedule("gpipe", ranks=1, microbatches=200)       # 2 000+ characters, one line
    assert Schedule.from_csv(sched.to_csv().strip()).actions == sched.actions


def test_from_text_accepts_rank_prefixes_comments_and_idle_marks():
    sched = Schedule.from_text("""
        # two ranks, two microbatches
        rank 0: 0F0 0F1 .   .   0B0 0B1
        rank 1: .   1F0 1B0 1F1 1B1
    """).validate()
    assert sched.ranks == 2 and sched.placement == (0, 1) and sched.microbatches == 2
    assert [str(a) for a in sched.actions[1]] == ["1F0", "1B0", "1F1", "1B1"]


def test_from_text_rejects_a_stage_on_two_ranks():
    with pytest.raises(ValueError, match="stage 0 appears on rank 0 and rank 1"):
        Schedule.from_text("0F0 0B0\n0F1 0B1")


@pytest.mark.parametrize("name,p,m,rows", [
    # Written out by hand from the papers' figures: warm-up min(p-1-i, m) forwards, then pairs.
    ("1f1b", 3, 4, ["0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
                    "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                    "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"]),
    ("1f1b", 4, 2, ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1",      # fewer microbatches than ranks
                    "2F0 2F1 2B0 2B1", "3F0 3B0 3F1 3B1"]),
    ("gpipe", 2, 3, ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]),
])
def test_generators_write_the_papers_order(name, p, m, rows):
    sched = pl.schedule(name, ranks=p, microbatches=m)
    assert [" ".join(map(str, acts)) for acts in sched.actions] == rows
    assert sched.placement == tuple(range(p))


def test_grid_lines_ranks_up_like_the_papers():
    text = str(pl.schedule("gpipe", ranks=2, microbatches=2))
    lines = text.splitlines()
    assert lines[0].split() == ["step", "|", "rank", "0", "rank", "1"]
    assert lines[2].split() == ["0", "|", "0F0", "."]
    assert lines[3].split() == ["1", "|", "0F1", "1F0"]


def test_registry_lists_names_and_rejects_bad_arguments():
    assert {"gpipe", "1f1b"} <= set(pl.SCHEDULES)
    with pytest.raises(ValueError, match="registered schedules: .*gpipe"):
        pl.schedule("nope", ranks=2, microbatches=2)
    with pytest.raises(ValueError, match="ranks must be a positive integer"):
        pl.schedule("1f1b", ranks=0, microbatches=2)
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        pl.schedule("1f1b", ranks=2, microbatches=2.5)
    with pytest.raises(ValueError, match="does not take option"):
        pl.schedule("gpipe", ranks=2, microbatches=2, chunks=2)


def _transfers(plan):
    """Every transfer as text, with the steps that send and receive it."""
    out = set()
    for rank, steps in enumerate(plan):
        for s in steps:
            out |= {(str(t), "sent after", str(s.action)) for t in s.send}
            out |= {(str(t), "received before", str(s.action)) for t in s.recv}
    return out


def test_comm_plan_derives_sends_and_receives():
    plan = comm_plan(pl.schedule("1f1b", ranks=2, microbatches=2))
    assert _transfers(plan) == {
        ("activation 0F0->1F0 (rank 0->1)", "sent after", "0F0"),
        ("activation 0F0->1F0 (rank 0->1)", "received before", "1F0"),
        ("activation 0F1->1F1 (rank 0->1)", "sent after", "0F1"),
        ("activation 0F1->1F1 (rank 0->1)", "received before", "1F1"),
        ("input gradient 1B0->0B0 (rank 1->0)", "sent after", "1B0"),
        ("input gradient 1B0->0B0 (rank 1->0)", "received before", "0B0"),
        ("input gradient 1B1->0B1 (rank 1->0)", "sent after", "1B1"),
        ("input gradient 1B1->0B1 (rank 1->0)", "received before", "0B1"),
    }
    assert {t.name for steps in plan for s in steps for t in s.recv} == {"x", "grad"}


def test_split_backward_sends_the_gradient_from_i_not_w():
    plan = comm_plan(Schedule.from_text("0F0 0I0 0W0\n1F0 1I0 1W0"))
    assert _transfers(plan) == {
        ("activation 0F0->1F0 (rank 0->1)", "sent after", "0F0"),
        ("activation 0F0->1F0 (rank 0->1)", "received before", "1F0"),
        ("input gradient 1I0->0I0 (rank 1->0)", "sent after", "1I0"),
        ("input gradient 1I0->0I0 (rank 1->0)", "received before", "0I0"),
    }


# --- the validator: broken schedules are rejected with the grid and a plain explanation -------

def _broken(text, **kw):
    with pytest.raises(ScheduleError) as info:
        Schedule.from_text(text, **kw).validate()
    message = str(info.value)
    assert "step |" in message, "the message shows the grid"
    return message


def test_rejects_missing_backward():
    msg = _broken("0F0 0F1 0B0\n1F0 1B0 1F1 1B1")
    assert "never runs the backward of microbatch 1" in msg and "0B1" in msg


def test_rejects_backward_before_forward():
    msg = _broken("0F0 0B0\n1B0 1F0")
    assert "runs 1B0 at step 0, before 1F0 at step 1" in msg
    assert ">1B0<" in msg and ">1F0<" in msg


def test_rejects_action_on_wrong_rank():
    msg = _broken("0F0 0B0 1F0\n1B0", placement=[0, 1])
    assert "1F0 is on rank 0, but stage 1 lives on rank 1" in msg and ">1F0<" in msg


def test_rejects_duplicated_action():
    msg = _broken("0F0 0F0 0B0\n1F0 1B0")
    assert "0F0 appears twice" in msg


def test_rejects_cross_rank_deadlock_and_names_who_waits_for_what():
    # Rank 0 insists on 0B0 before sending 0F1, but rank 1 wants 1F1 before running 1B0.
    msg = _broken("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1")
    assert "deadlock" in msg
    assert "rank 1 waits for 0F1 (to run 1F1), which rank 0 only runs after 0B0" in msg
    assert "rank 0 waits for 1B0 (to run 0B0), which rank 1 only runs after 1F1" in msg
    assert ">0B0<" in msg and ">1F1<" in msg


def test_rejects_out_of_range_microbatch_and_half_split_backward():
    msg = _broken("0F0 0F1 0B0 0B1", microbatches=1)
    assert "0F1 names microbatch 1, but microbatches are 0..0" in msg and ">0F1<" in msg
    msg = _broken("0F0 0I0")
    assert "0W0 is missing" in msg


def test_accepts_split_backward_in_order():
    sched = Schedule.from_text("0F0 0I0 0W0\n1F0 1I0 1W0").validate()
    assert pl.simulate(sched).makespan == 5.0     # 1W0 overlaps 0I0: the zero-bubble idea


def test_long_schedule_error_shows_a_window_not_thousands_of_lines():
    sched = pl.schedule("1f1b", ranks=4, microbatches=256)
    sched.actions[2].pop()           # drop the last backward of stage 2
    with pytest.raises(ScheduleError) as info:
        sched.validate()
    assert len(str(info.value).splitlines()) < 40


def test_pickled_schedule_leaves_its_caches_behind():
    import pickle
    sched = pl.schedule("1f1b", ranks=4, microbatches=64)          # validated: caches are full
    again = pickle.loads(pickle.dumps(sched))                      # what each worker receives
    assert again == sched and again._checked is None and again._index is None
    never_checked = Schedule(sched.actions, sched.placement, sched.microbatches, sched.name)
    assert len(pickle.dumps(sched)) == len(pickle.dumps(never_checked))
    assert again.input_grad_action(1, 3) == Action(1, "B", 3)
