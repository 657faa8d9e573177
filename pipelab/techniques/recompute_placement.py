"""Where a schedule's recomputations `R` go: right before their backward, or earlier, in idle time.

    with_recompute(sched)                                   # sRm right before each B (or I)
    with_recompute(sched, placement="early", costs=costs)   # each R moved into an earlier gap

`R` only needs its own forward, so right before its backward it runs as soon as the rank is
free: where the rank would wait for the gradient anyway, it costs nothing (1F1B's first rank).
Where the rank waits for something else earlier — a forward's activation, say — an R placed in
that gap is hidden too. The `early` placement looks for such gaps on the simulated timeline.

Its bound, stated and kept: an R never moves before the backward that precedes its own on its
rank, so a rank holds at most one recomputed microbatch-stage at a time, as with the default
placement. What can grow is the time that recomputed data stays alive (the forwards that now
run between R and its backward add their kept bytes while it is held); `memory.peak_bytes`
says by how much. A move is kept only when the simulated makespan does not grow.
"""
from __future__ import annotations

import copy

from ..schedules.actions import Action
from ..schedules.base import Schedule
from ..sim.costs import Costs
from ..sim.simulate import simulate

RECOMPUTE = "R"
BACKWARDS = ("B", "I")
PLACEMENTS = ("backward", "early")


def with_recompute(schedule: Schedule, stages=None, *, placement: str = "backward",
                   costs=None) -> Schedule:
    """The schedule with `sRm` for every stage `s` in `stages` (default: all) and microbatch
    `m`: right before its backward (B, or I when split), or with placement="early" as early as
    the rank's idle time on the simulated timeline (`costs`, default pl.Costs()) allows, never
    before the rank's previous backward. A pure function; `schedule` is unchanged."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if RECOMPUTE in schedule.kinds():
        raise ValueError(f"schedule {schedule.name!r} already has recomputations (R)")
    chosen = set(range(schedule.stages) if stages is None else stages)
    actions = []
    for acts in schedule.actions:
        out = []
        for item in acts:
            out += [Action(p.stage, RECOMPUTE, p.microbatch) for p in item.parts
                    if p.kind in BACKWARDS and p.stage in chosen]
            out.append(item)
        actions.append(out)
    result = _with_actions(schedule, actions, f"{schedule.name} + recompute")
    if placement == "early":
        result = _early(result, costs)
        result.name = f"{schedule.name} + early recompute"
    return result


def _with_actions(schedule: Schedule, actions, name: str) -> Schedule:
    """A copy of `schedule` (whatever other transforms remembered on it: data_parallel, weight
    versions) with new actions and name, its caches cleared."""
    result = copy.copy(schedule)
    result.actions = [list(acts) for acts in actions]
    result.name = name
    result._index = result._checked = None
    return result


def _early(schedule: Schedule, costs) -> Schedule:
    """Move each R, rank by rank and in order, to the earliest idle gap between the rank's
    previous backward (or its own F, if later) and its backward; keep a move only when the
    simulated makespan does not grow."""
    costs = Costs() if costs is None else costs
    best = simulate(schedule, costs).makespan
    for rank in range(schedule.ranks):
        for r in [a for a in schedule.actions[rank] if a.kind == RECOMPUTE]:
            acts = schedule.actions[rank]
            here = acts.index(r)
            lowest = _window_start(acts, here, r)
            if lowest == here:
                continue
            tl = simulate(schedule, costs)
            events = tl.events_of(rank)           # in the rank's order: one per action
            for q in range(lowest, here):
                gap = events[q].start - (events[q - 1].end if q else 0.0)
                if gap <= 0:
                    continue
                trial = _with_actions(schedule, _moved(schedule.actions, rank, here, q),
                                      schedule.name)
                span = simulate(trial, costs).makespan
                if span <= best + 1e-12:
                    schedule, best = trial, span
                    break
    return schedule


def _window_start(acts: list, here: int, r: Action) -> int:
    """The earliest index R may take: after its own forward and after the rank's previous
    backward (at most one recomputed microbatch-stage alive on the rank)."""
    lowest = 0
    for i in range(here - 1, -1, -1):
        parts = acts[i].parts
        if any(p.kind in BACKWARDS for p in parts) or any(
                p.kind == "F" and (p.stage, p.microbatch) == (r.stage, r.microbatch) for p in parts):
            lowest = i + 1
            break
    return lowest


def _moved(actions, rank: int, here: int, to: int) -> list[list]:
    out = [list(acts) for acts in actions]
    item = out[rank].pop(here)
    out[rank].insert(to, item)
    return out
