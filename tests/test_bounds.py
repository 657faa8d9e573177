"""Issue 9, points 4-6: sizes are bounded before any work, nothing is silently misread, and a
timeout message stays readable. No processes here: everything is checked in the parent."""
from __future__ import annotations

import time

import pytest

import pipelab as pl
from pipelab import Schedule
from pipelab.runtime.board import RUN, SETUP, RankState
from pipelab.runtime.spec import prepare_run
from pipelab.runtime.watchdog import diagnose
from pipelab.schedules import comm_plan

CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
SCHED = pl.schedule("1f1b", ranks=2, microbatches=2)


def fast(call, seconds: float = 2.0):
    """Run `call`, which must raise ValueError quickly; return the message. Quickly in CPU
    time: the work a late refusal does is ours, while the wall clock also holds the time other
    processes took from us on a loaded machine."""
    began = time.process_time()
    with pytest.raises(ValueError) as err:
        call()
    assert time.process_time() - began < seconds, "refused, but only after doing the work"
    message = str(err.value)
    assert len(message) < 600, f"message of {len(message)} characters"
    return message


# --- 4. bounds before work --------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**64, -2**63 - 1, 10**30])
def test_run_seed_beyond_64_bits_is_refused_up_front(seed) -> None:
    message = fast(lambda: prepare_run(SCHED, ranks=2, model=CFG, seed=seed))
    assert "seed" in message and "out of range" in message


def test_model_seed_whose_layer_seeds_overflow_is_refused() -> None:
    message = fast(lambda: pl.ModelConfig(seed=2**62))
    assert "ModelConfig.seed" in message and "64 bits" in message
    big = (2**64 - 6) // 1_000_003           # the largest seed whose 6 layer seeds fit
    pl.build_layers(pl.ModelConfig(n_layers=4, d_model=8, n_heads=2, seed=big), 0, 6)
    pl.ModelConfig(seed=-(2**63 // 1_000_003))


@pytest.mark.parametrize("stage", [10**11, 3 * 10**6])
def test_from_text_with_a_huge_stage_number_fails_fast_and_short(stage) -> None:
    message = fast(lambda: Schedule.from_text(f"0F0 0B0\n{stage}F0 {stage}B0"))
    assert f"stage {stage}" in message and "limit" in message


def test_from_text_with_a_huge_microbatch_number_fails_fast() -> None:
    assert "limit" in fast(lambda: Schedule.from_text("0F0 0F99999999999 0B0"))


def test_missing_stages_are_listed_briefly() -> None:
    message = fast(lambda: Schedule.from_text("0F0 0B0\n60000F0 60000B0"))
    assert "59,999 in all" in message


def test_layout_with_a_huge_count_fails_fast() -> None:
    message = fast(lambda: pl.partition(CFG, method="E|t*99999999999|L"))
    assert "99999999999 blocks but the model has 2" in message
    assert "t*99999999" in fast(lambda: pl.partition(CFG, method="E|t*" + "9" * 5000 + "|L"))


def test_schedule_with_too_many_ranks_is_refused_at_once() -> None:
    message = fast(lambda: pl.schedule("1f1b", ranks=100000, microbatches=8), seconds=1.0)
    assert "ranks=100000" in message and "limit" in message
    with pytest.raises(ValueError, match="ranks"):
        pl.LocalCluster(ranks=100000, start=False)


def test_validation_is_linear_in_ranks() -> None:
    """stages_of per rank made validating a wide pipeline quadratic."""
    wide = pl.schedule("gpipe", ranks=8000, microbatches=1)
    wide._checked = None
    began = time.process_time()                  # CPU time: the machine's load cannot add to it
    wide.validate()
    assert time.process_time() - began < 5.0      # ~0.2 s here; minutes when quadratic


def test_error_grid_of_a_wide_schedule_is_omitted() -> None:
    text = "\n".join(f"{r}F0 {r}B0" for r in range(100)) + "\n"
    broken = Schedule.from_text(text.replace("99B0", "99W0"))
    with pytest.raises(pl.ScheduleError) as err:
        broken.validate()
    assert "grid omitted" in str(err.value) and len(str(err.value)) < 600


# --- 5. no silent misreading -------------------------------------------------------------------
def test_rank_labels_are_honoured() -> None:
    s = Schedule.from_text("rank 1: 1F0 1B0\nrank 0: 0F0 0B0")
    assert [list(map(str, a)) for a in s.actions] == [["0F0", "0B0"], ["1F0", "1B0"]]
    assert s.placement == (0, 1)


@pytest.mark.parametrize("text, message", [
    ("rank 0: 0F0 0B0\nrank 0: 1F0 1B0", "rank 0 has a line already"),
    ("rank 0: 0F0 0B0\nrank 2: 1F0 1B0", "rank 1 has no line"),
    ("rank 0: 0F0 0B0\n1F0 1B0", "label every line or none"),
    ("stage 0: 0F0 0B0", "cannot read the label 'stage 0'"),
])
def test_bad_rank_labels_are_refused(text, message) -> None:
    assert message in fast(lambda: Schedule.from_text(text))


@pytest.mark.parametrize("text", [None, b"0F0 0B0", 3])
def test_from_text_needs_a_str(text) -> None:
    assert "text must be a str" in fast(lambda: Schedule.from_text(text))
    assert "from_csv takes a path" in fast(lambda: Schedule.from_csv(text))


def test_from_text_microbatches_must_be_an_int() -> None:
    assert "microbatches must be a positive integer, got 1.5" in \
        fast(lambda: Schedule.from_text("0F0 0B0", microbatches=1.5))
    with pytest.raises(ValueError, match="placement"):
        Schedule.from_text("0F0 0B0", placement=[0.5])


def test_float_layer_bounds_are_refused_not_truncated() -> None:
    message = fast(lambda: pl.Partition(CFG, [(0, 2.7), (2.7, 4)], "custom"))
    assert "integer layer indices" in message and "2.7" in message
    message = fast(lambda: prepare_run(SCHED, ranks=2, model=CFG, partition=[(0, 2.0), (2.0, 4)]))
    assert "partition" in message


@pytest.mark.parametrize("check", ["no", 0, None])
def test_check_must_be_a_bool(check) -> None:
    assert "check must be True or False" in \
        fast(lambda: prepare_run(SCHED, ranks=2, model=CFG, check=check))


# --- 6. readable timeouts ----------------------------------------------------------------------
def _states(schedule, stuck_rank: int, position: int, sent: float, fresh_rank=None):
    now = sent + 100.0
    states = []
    for r in range(schedule.ranks):
        if r == fresh_rank:
            states.append(RankState(r, 0, 0, SETUP, 0, sent))      # still the parent's reset
        elif r == stuck_rank:
            states.append(RankState(r, 0, position, RUN, 0, sent + 1.0))
        else:
            states.append(RankState(r, 0, 0, SETUP, 0, sent + 0.5))  # got the run, then stuck
    return states, now


def test_timeout_message_shows_a_window_not_the_whole_grid() -> None:
    big = pl.schedule("1f1b", ranks=4, microbatches=64)
    assert len(str(big).splitlines()) > 130
    states, now = _states(big, 2, 60, sent=1000.0)
    error = diagnose(states, big, comm_plan(big), 30.0, now, sent=1000.0)
    lines = str(error).splitlines()
    assert len(lines) < 30, str(error)
    assert any(">2F" in line or ">2B" in line for line in lines)
    assert "earlier steps" in str(error) and "later steps" in str(error)


def test_timeout_says_a_rank_never_received_the_run() -> None:
    states, now = _states(SCHED, None, 0, sent=1000.0, fresh_rank=1)
    states[0] = RankState(0, 0, 0, SETUP, 0, 1000.0)
    error = diagnose(states, SCHED, comm_plan(SCHED), 30.0, now, sent=1000.0)
    assert "has not received the run yet" in str(error)
    assert error.rank in (0, 1)
    # A rank that received the run and is building its stages is not confused with it.
    states, now = _states(SCHED, None, 0, sent=1000.0)
    assert "has not received" not in str(diagnose(states, SCHED, comm_plan(SCHED), 30.0, now,
                                                  sent=1000.0))
