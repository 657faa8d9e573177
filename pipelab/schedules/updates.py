"""Optimizer updates inside a schedule, and the weight versions they make.

A schedule that never flushes (PipeDream, PipeDream-2BW) cannot leave the optimizer step to the
end of a training step: there is no end. So the update is an action of its own, `U`, written
like `1U7`: "stage 1 applies the gradient of its microbatches up to 7 and makes a new weight
version". Each `U` covers the microbatches after the stage's previous update, up to its own.

Which version a forward uses is written in the schedule too, so that it survives the text and
CSV forms (which hold nothing but actions):

- by default, the newest one when the forward runs (PipeDream; a flushed 1F1B);
- on a stage that has `V` actions, the one its latest `V` selected: `1V3` reads "from here on,
  stage 1's forwards use the version 1U3 made" (before its first `V`: the initial weights). A
  rule that lags on purpose (2BW: batch b reads the version of b − 2's update) is written this
  way. `V` has an ordering edge to the update it names, so the validator rejects a switch to a
  version not made yet; the forwards after it run on the same rank, so they follow it.

Its backward always uses the same version (weight stashing): that is what makes the gradient
of each microbatch exact for *some* weights. `version_plan` is the one place that turns a
schedule into who-uses-what and when each version may be freed; the runtime
(techniques/async_versions.py), the emulation (techniques/async_staleness.py) and the plots all
read it.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from .actions import NO_MICROBATCH, Action
from .errors import ScheduleError
from .kinds import UPDATE as UPDATE_ROLE
from .kinds import (FORWARD, INPUT_GRAD, VERSION_SELECT, Input, cached_with_index,
                    gradient_edges, gradient_passes, kinds_with_role, register_kind)

UPDATE = "U"
SELECT = "V"
_new = tuple.__new__


def updates_by_stage(schedule) -> dict[int, list[int]]:
    """{stage: sorted microbatches of its U actions}, cached with the schedule's index."""
    return cached_with_index(schedule, "_updates", _updates_by_stage)


def _updates_by_stage(schedule) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for acts in schedule.actions:
        for item in acts:
            for stage, kind, mb in item.parts:
                if kind == UPDATE:
                    found.setdefault(stage, []).append(mb)
    for mbs in found.values():
        mbs.sort()
    return found


def covered(schedule, action: Action) -> range:
    """The microbatches whose gradient `action` (a U) applies: after the previous update of its
    stage, up to and including its own."""
    mbs = updates_by_stage(schedule).get(action[0], [])
    i = bisect_left(mbs, action[2])          # its place among the stage's updates
    return range(mbs[i - 1] + 1 if i else 0, action[2] + 1)


def _update_inputs(schedule, a: Action) -> list[Input]:
    """Ordering edges to the gradient pass (B, or W when split) of every covered microbatch:
    the update reads the accumulated .grad, local state."""
    return gradient_edges(schedule, ((a[0], mb) for mb in covered(schedule, a)))


register_kind(UPDATE, "optimizer update of the stage's weights (makes a new weight version)",
              inputs=_update_inputs, cost=lambda costs, stage: 0.0, module="pipelab",
              role=UPDATE_ROLE, colour="#937860", label="update")


def _select_inputs(schedule, a: Action) -> list[Input]:
    """An ordering edge to the update whose version it selects (local state, no message)."""
    return [_new(Input, ("version", _new(Action, (a[0], UPDATE, a[2])), False))]


register_kind(SELECT, "switch the stage's forwards to the weight version an update made",
              inputs=_select_inputs, cost=lambda costs, stage: 0.0, module="pipelab",
              role=VERSION_SELECT, colour="#c9b8a8", label="version")


def update(stage: int, microbatch: int) -> Action:
    """The action `<stage>U<microbatch>`."""
    return Action(stage, UPDATE, microbatch)


def select(stage: int, made_by: int) -> Action:
    """The action `<stage>V<mb>`: later forwards of `stage` use the version `<stage>U<mb>` made."""
    return Action(stage, SELECT, made_by)


def has_updates(schedule) -> bool:
    return bool(updates_by_stage(schedule))


@dataclass
class VersionPlan:
    """Who uses which weight version, per stage. A version is named by the U that made it
    (None: the initial weights)."""
    source: dict[tuple[int, int], Action | None]     # (stage, mb) -> version its F and B use
    retire: dict[Action, list]                       # U -> versions freed right after it
    users: dict[tuple[int, Action | None], list[int]]   # (stage, version) -> microbatches

    def live_after(self, schedule) -> dict[int, list[tuple[Action, int]]]:
        """{stage: [(U, versions held right after it)]} in the rank's order."""
        out: dict[int, list] = {}
        for acts in schedule.actions:
            held: dict[int, int] = {}
            for item in acts:
                for part in item.parts:
                    if part[1] != UPDATE:
                        continue
                    stage = part[0]
                    held[stage] = held.get(stage, 1) + 1 - len(self.retire[part])
                    out.setdefault(stage, []).append((part, held[stage]))
        return out

    def max_versions(self, schedule) -> dict[int, int]:
        """Most weight versions each stage holds at once (1 for a schedule without updates)."""
        live = self.live_after(schedule)
        return {s: max([1] + [n for _u, n in live.get(s, [])]) for s in range(schedule.stages)}


def version_plan(schedule) -> VersionPlan:
    """Resolve each forward's version (on a stage with `V` actions, the latest one's; else the
    newest when it runs) and, for each update, the versions no later action reads: freed right
    after it (each stage keeps its newest version, the base of the next update)."""
    selecting = {part[0] for acts in schedule.actions for item in acts for part in item.parts
                 if part[1] == SELECT}
    source, last_use, position = {}, {}, {}
    forwards = kinds_with_role(FORWARD)     # the passes that read a weight version
    for acts in schedule.actions:
        newest: dict[int, Action | None] = {}
        chosen: dict[int, Action | None] = {}
        for i, item in enumerate(acts):
            for part in item.parts:
                stage, kind, mb = part
                position[part] = i
                if kind == UPDATE:
                    newest[stage] = part
                elif kind == SELECT:
                    chosen[stage] = _new(Action, (stage, UPDATE, mb))
                elif kind in forwards:
                    source[(stage, mb)] = (chosen if stage in selecting else newest).get(stage)
                if kind not in (UPDATE, SELECT) and mb != NO_MICROBATCH:
                    last_use[(stage, mb)] = i
    users: dict = {}
    for (stage, mb), version in source.items():
        users.setdefault((stage, version), []).append(mb)
    retire: dict[Action, list] = {}
    for stage, mbs in updates_by_stage(schedule).items():
        alive = [None]
        for mb in mbs:
            u = _new(Action, (stage, UPDATE, mb))
            done = [v for v in alive if max((last_use.get((stage, m), -1)
                                             for m in users.get((stage, v), ())), default=-1)
                    < position[u]]
            retire[u] = done
            alive = [v for v in alive if v not in done] + [u]
    return VersionPlan(source, retire, users)


def check_updates(schedule) -> None:
    """What the runtime's update rule assumes, checked before a run: on every stage, each
    microbatch's gradient pass lies between the update before its own and its own update (an
    update applies what was accumulated since the previous one), and every microbatch is
    covered by an update (no gradient is silently dropped); and no backward is split into I
    and W, because I already writes part of the weight gradient."""
    schedule.reindex()            # the actions may have been edited since the last look
    updates = updates_by_stage(schedule)
    halves = kinds_with_role(INPUT_GRAD)
    split = [(rank, i, part) for rank, acts in enumerate(schedule.actions)
             for i, item in enumerate(acts) for part in item.parts if part[1] in halves]
    if updates and split:
        # Measured before this rule: zb-h1 with an update after each W, gradient errors of 1–10
        # (an update applied the LayerNorm gradients of a microbatch it does not cover).
        rank, i, part = split[0]
        raise ScheduleError(
            f"{part}: a split backward (I/W) cannot be combined with optimizer updates (U) in "
            f"the schedule: I already writes the LayerNorm and embedding gradients, so an "
            f"update after a later microbatch's I applies part of that microbatch's gradient; "
            f"use full backwards (B)", schedule, [(rank, i)])
    passes = gradient_passes(schedule)
    for rank, acts in enumerate(schedule.actions):
        since: dict[int, list[int]] = {}
        for i, item in enumerate(acts):
            for stage, kind, mb in item.parts:
                if stage not in updates:
                    continue
                if kind == passes.get((stage, mb), "B"):
                    since.setdefault(stage, []).append(mb)
                elif kind == UPDATE:
                    want = covered(schedule, Action(stage, UPDATE, mb))
                    extra = [m for m in since.get(stage, []) if m not in want]
                    if extra:
                        raise ScheduleError(
                            f"{stage}U{mb} would also apply microbatch {extra[0]}'s gradient "
                            f"(its backward runs before it), but it covers microbatches "
                            f"{want.start}..{want.stop - 1}: move {stage}U{mb} before that "
                            f"backward, or cover it", schedule, [(rank, i)])
                    since[stage] = []
    for stage, mbs in updates.items():
        if mbs[-1] != schedule.microbatches - 1:
            raise ScheduleError(f"microbatches {mbs[-1] + 1}..{schedule.microbatches - 1} of stage "
                                f"{stage} are never applied: end the stage with "
                                f"{stage}U{schedule.microbatches - 1}", schedule)
    missing = [s for s in range(schedule.stages) if s not in updates]
    if missing:
        raise ScheduleError(f"stage {missing[0]} has no optimizer update (U) while other stages "
                            f"do: every stage must update its own weights", schedule)
