"""Asynchronous pipelines: PipeDream (weight stashing) and PipeDream-2BW (double-buffered weights).

1F1B with a flush (one_f_one_b.py) drains the pipeline before every optimizer step and pays the
bubble each time. These schedules never drain: microbatches stream through one long 1F1B, and
each stage updates its weights while later microbatches are still in flight. The price moves
from time to weights:

- **PipeDream** (Narayanan et al., arXiv 1806.03377): every microbatch is its own minibatch;
  each stage updates right after each backward (`sU<mb>`). A microbatch's backward must use
  the weights its forward used, so each in-flight microbatch keeps its version: up to p
  versions on the first stage, one on the last. Different stages see different versions of
  the same microbatch (no vertical sync): the gradient is exact for a mix of stale weights.
- **PipeDream-2BW** (Narayanan et al., arXiv 2006.09503): gradients of m ≥ p microbatches are
  accumulated into one update; batch b runs with the version made after batch b − 2, on every
  stage, so at most two versions are alive: W(t+1) = W(t) − ν·∇f(W(t−1)). The lag is written
  in the schedule: a `V` before each batch's first forward switches the stage to that version
  (updates.py), so the text and CSV forms keep it.

`flushed(schedule, steps)` writes the synchronous comparison as the same kind of schedule: the
one-step schedule repeated, with an update after each stage's last backward of each step.
"""
from __future__ import annotations

from ..checks import positive_int
from .actions import Action, Compound
from .base import Schedule
from .kinds import BACKWARD, FORWARD, WEIGHT_GRAD, kinds_with_role
from .one_f_one_b import one_f_one_b
from .registry import register
from .updates import select, update


def with_updates(schedule: Schedule, every: int, name: str) -> Schedule:
    """`schedule` with an update `sU<mb>` right after the backward of every `every`-th
    microbatch on each stage (mb = every−1, 2·every−1, …): one continuous stream, no flush."""
    finishing = kinds_with_role(BACKWARD, WEIGHT_GRAD)   # the passes that complete .grad
    actions = []
    for acts in schedule.actions:
        out = []
        for item in acts:
            out.append(item)
            for stage, kind, mb in item.parts:
                if kind in finishing and (mb + 1) % every == 0:
                    out.append(update(stage, mb))
        actions.append(out)
    return Schedule(actions, schedule.placement, schedule.microbatches, name=name)


@register("pipedream")
def pipedream(ranks: int, microbatches: int) -> Schedule:
    """Asynchronous 1F1B with weight stashing: an update after every backward."""
    return with_updates(one_f_one_b(ranks, microbatches), every=1, name="pipedream")


@register("pipedream-2bw")
def pipedream_2bw(ranks: int, microbatches: int, per_update: int | None = None) -> Schedule:
    """Asynchronous 1F1B that accumulates `per_update` (m ≥ ranks; default ranks) microbatches
    into each update; batch b = microbatches b·m … b·m+m−1 reads the version made after batch
    b − 2 (the initial weights for b < 2) on every stage."""
    m = ranks if per_update is None else positive_int("per_update", per_update)
    if m < ranks:
        raise ValueError(f"per_update must be at least ranks ({ranks}), got {m}: the update after "
                         f"batch b must come before batch b+2 enters the pipeline, which keeps "
                         f"two weight versions enough")
    if microbatches % m:
        raise ValueError(f"microbatches ({microbatches}) must be a multiple of per_update ({m}): "
                         f"every batch of {m} microbatches ends with an update")
    return _lagged(with_updates(one_f_one_b(ranks, microbatches), every=m, name="pipedream-2bw"),
                   m)


def _lagged(schedule: Schedule, m: int) -> Schedule:
    """`schedule` with `sV<(b−1)·m−1>` before the first forward of each batch b ≥ 2 on every
    stage: the batch reads the version made by the update after batch b − 2."""
    forwards = kinds_with_role(FORWARD)
    actions = []
    for acts in schedule.actions:
        out = []
        for item in acts:
            out += [select(stage, mb - m - 1) for stage, kind, mb in item.parts
                    if kind in forwards and mb % m == 0 and mb >= 2 * m]
            out.append(item)
        actions.append(out)
    return Schedule(actions, schedule.placement, schedule.microbatches, name=schedule.name)


def flushed(schedule: Schedule, steps: int) -> Schedule:
    """The synchronous baseline as one continuous schedule: `steps` copies of a one-step
    schedule (1F1B, GPipe), microbatches renumbered, each stage updating after its last
    backward of each copy. The next copy's forwards wait for the update: the flush."""
    positive_int("steps", steps)
    m = schedule.microbatches
    finishing = kinds_with_role(BACKWARD, WEIGHT_GRAD)
    actions = []
    for acts in schedule.actions:
        last = {}
        for i, item in enumerate(acts):
            for part in item.parts:
                if part.kind in finishing:
                    last[part.stage] = i
        out = []
        for k in range(steps):
            for i, item in enumerate(acts):
                out.append(_shifted(item, k * m))
                out += [update(s, k * m + m - 1) for s, j in sorted(last.items()) if j == i]
        actions.append(out)
    return Schedule(actions, schedule.placement, m * steps, name=f"{schedule.name} × {steps} steps")


def _shifted(item, offset: int):
    parts = [Action(p.stage, p.kind, p.microbatch + offset) for p in item.parts]
    if len(parts) == 1:
        return parts[0]
    return Compound(parts)
