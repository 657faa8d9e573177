"""Several training steps in a row, as one schedule: what a step costs once steps tile.

A schedule describes one optimizer step. Whether the next step may start on a rank before the
whole pipeline has finished depends on the optimizer: with a global synchronisation before the
update (gradient-norm clipping, a NaN check) every rank waits for the slowest; with the
zero-bubble paper's *post-validation* (§4 of arXiv 2401.10241: update at once, check afterwards
and roll back in the rare bad case) a rank's next step waits only for its own update. Here that
second case is written as data: each rank runs step k's actions, then step k+1's, with step
k+1's microbatches numbered after step k's, so the only thing ordering the steps is the data
flow between ranks and each rank's own program order.
"""
from __future__ import annotations

from . import Schedule
from .actions import NO_MICROBATCH, Action, Compound


def _shifted(action, by: int):
    if isinstance(action, Compound):
        return Compound(_shifted(part, by) for part in action.parts)
    return Action(action.stage, action.kind, action.microbatch + by)


def consecutive(schedule: Schedule, steps: int = 2) -> Schedule:
    """`steps` copies of `schedule` run back to back with no barrier between them: rank r runs
    its step-1 actions, then its step-2 actions (microbatches m..2m−1), and so on."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if schedule.routes is not None and len(schedule.routes) > 1:
        raise ValueError(f"consecutive steps of {schedule.name!r} are not supported: it has "
                         f"{len(schedule.routes)} routes, and which route a microbatch takes "
                         f"depends on its number")
    whole_step = sorted({str(a) for acts in schedule.actions for a in acts
                         if any(p.microbatch == NO_MICROBATCH for p in a.parts)})
    if whole_step:
        raise ValueError(f"consecutive steps of {schedule.name!r} are not supported: actions "
                         f"{', '.join(whole_step)} belong to the whole step, not to a microbatch")
    m = schedule.microbatches
    actions = [[_shifted(a, k * m) for k in range(steps) for a in acts]
               for acts in schedule.actions]
    return Schedule(actions, schedule.placement, m * steps, name=f"{schedule.name} × {steps} steps",
                    routes=schedule.routes, slices=schedule.slices)
