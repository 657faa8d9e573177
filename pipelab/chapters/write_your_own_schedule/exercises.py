"""The exercises of notebook 13, in rising difficulty: each a task, a starting text, a goal the
workbench checks on the simulator (on the exercise's costs) and a solution.

1. fix a schedule that deadlocks            (valid; exact live)
2. write 1F1B for 3 ranks                   (1F1B's memory, GPipe's step)
3. beat 1F1B's bubble with an I/W split     (shorter than 1F1B, same memory)
4. beat zb-h1 under a memory limit          (shorter than zb-h1, holding at most 4)
"""
from __future__ import annotations

from ...sim.costs import Costs

from ...sim.simulate import simulate
from .workbench import Attempt, Exercise
from ...schedules import schedule


def _text(name: str, ranks: int, microbatches: int) -> str:
    """A registered schedule as the reader writes it: one line per rank, no header."""
    return "\n".join(" ".join(map(str, acts))
                     for acts in schedule(name, ranks=ranks, microbatches=microbatches).actions)


def _reference(name: str, exercise: Exercise):
    return simulate(schedule(name, ranks=exercise.ranks, microbatches=exercise.microbatches),
                    exercise.costs)


def _peaks_at_most(att: Attempt, limits: list[float]) -> str | None:
    peaks = att.simulated.peak_activations()
    for rank, limit in enumerate(limits):
        if peaks[rank] > limit + 1e-9:
            return (f"rank {rank} holds {peaks[rank]:g} microbatches' activations at its peak; "
                    f"the limit is {limit:g}")
    return None


def _faster_than(att: Attempt, name: str, exercise: Exercise) -> str | None:
    theirs = _reference(name, exercise).makespan
    if att.simulated.makespan < theirs - 1e-9:
        return None
    return f"your step takes {att.simulated.makespan:g}; {name} takes {theirs:g} — go below it"


# --- 1 -------------------------------------------------------------------------------------------

DEADLOCK = Exercise(
    title="1. Fix a deadlock",
    task="Rank 0 runs each backward before its next forward; rank 1 runs all its forwards first. "
         "Press <b>check</b>: the validator names who waits for whom. Change as few actions as "
         "you can so that the schedule runs (and computes the right gradients).",
    ranks=3, microbatches=3,
    starter="0F0 0B0 0F1 0B1 0F2 0B2\n"
            "1F0 1F1 1F2 1B0 1B1 1B2\n"
            "2F0 2B0 2F1 2B1 2F2 2B2",
    solution="0F0 0F1 0F2 0B0 0B1 0B2\n"
             "1F0 1F1 1F2 1B0 1B1 1B2\n"
             "2F0 2B0 2F1 2B1 2F2 2B2",
    costs=Costs(F=1.0, I=1.0, W=1.0),
    hint="rank 1 needs 0F1 before it can finish its forwards; rank 0 waits for 1B0 first",
)


# --- 2 -------------------------------------------------------------------------------------------

def _one_f_one_b_goal(att: Attempt) -> str | None:
    kinds = att.schedule.kinds()
    if kinds != {"F", "B"}:
        return f"use only F and B here (found {', '.join(sorted(kinds - {'F', 'B'}))})"
    return _peaks_at_most(att, [3, 2, 1]) or \
        (None if att.simulated.makespan <= _reference("gpipe", ONE_F_ONE_B).makespan + 1e-9
         else "it is slower than GPipe: some rank waits longer than it must")


ONE_F_ONE_B = Exercise(
    title="2. Write 1F1B for 3 ranks",
    task="The starting text is GPipe (every rank holds all 4 microbatches at its peak). Reorder "
         "each rank's actions so that rank r never holds more than 3 − r microbatches, without "
         "making the step longer than GPipe's. Use only F and B.",
    ranks=3, microbatches=4,
    starter=_text("gpipe", 3, 4),
    solution="0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3\n"
             "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3\n"
             "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    costs=Costs(F=1.0, I=1.0, W=1.0),
    goal=_one_f_one_b_goal,
    hint="warm up with 3 − r − 1 forwards, then alternate one forward and one backward",
)


# --- 3 -------------------------------------------------------------------------------------------

def _split_goal(att: Attempt) -> str | None:
    return _peaks_at_most(att, [3, 3, 3]) or _faster_than(att, "1f1b", SPLIT)


SPLIT = Exercise(
    title="3. Beat 1F1B's bubble with an I/W split",
    task="This is 1F1B (F = I = W = 1, so B = 2). Write each B as I (the input gradient, which the "
         "rank before waits for) and W (the weight gradient, which nobody waits for), and move "
         "W's into the gaps. Goal: a shorter step than 1F1B's 18, no rank holding more than 3.",
    ranks=3, microbatches=4,
    starter=_text("1f1b", 3, 4),
    solution="0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3\n"
             "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3\n"
             "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    costs=Costs(F=1.0, I=1.0, W=1.0),
    goal=_split_goal,
    hint="a rank's memory is freed by W, not I: a W you delay keeps its microbatch held",
)


# --- 4 -------------------------------------------------------------------------------------------

MEMORY_LIMIT = 4


def _limit_goal(att: Attempt) -> str | None:
    return _peaks_at_most(att, [MEMORY_LIMIT] * 3) or _faster_than(att, "zb-h1", LIMITED)


LIMITED = Exercise(
    title="4. Beat zb-h1 under a memory limit",
    task=f"Messages now cost 0.5 (F = I = W = 1). The starting text is zb-h1, whose ranks hold 3 "
         f"microbatches each; you may hold {MEMORY_LIMIT}. Goal: a shorter step than zb-h1's 24 "
         f"(simulated), no rank above {MEMORY_LIMIT}.",
    ranks=3, microbatches=6,
    starter=_text("zb-h1", 3, 6),
    solution="0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5\n"
             "1F0 1F1 1F2 1I0 1W0 1F3 1I1 1W1 1F4 1I2 1W2 1F5 1I3 1W3 1I4 1W4 1I5 1W5\n"
             "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2F4 2I4 2W2 2F5 2I5 2W3 2W4 2W5",
    costs=Costs(F=1.0, I=1.0, W=1.0, comm=0.5),
    goal=_limit_goal,
    hint="the first I is late (it crosses every rank twice, with messages): one more warm-up "
         "forward on ranks 0 and 1 fills that wait",
)

EXERCISES = [DEADLOCK, ONE_F_ONE_B, SPLIT, LIMITED]
