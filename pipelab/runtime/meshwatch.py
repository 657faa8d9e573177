"""A stalled mesh explained: which process (by its coordinates) waits, and in what.

On a mesh of pp × dp processes two things can stall a step: a message along one replica's
pipeline (the single-pipeline watchdog explains that, read in the replica's own coordinates),
a gradient all-reduce whose replicas do not all arrive ("pp 1 / dp 0 waits in all-reduce of
stage 1's gradients (1AR); dp 1 never reached it: it is running 1AR"), and an expert all-to-all
inside an action that a peer of the data-parallel group never joins.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..parallel.data_parallel import REDUCE
from ..parallel.expert import IN_ALL_TO_ALL
from .board import DONE, RUN, RankState
from .errors import PipelineTimeout
from .watchdog import describe, diagnose


def _in_reduction(state: RankState, plan) -> bool:
    """Waiting inside a gradient all-reduce (launched, not complete): detail 1 at an AR step."""
    steps = plan[state.pp]
    return state.state == RUN and state.detail == 1 and state.position < len(steps) and \
        steps[state.position].action.parts[0].kind == REDUCE


def _in_all_to_all(state: RankState) -> bool:
    return state.state == RUN and state.detail == IN_ALL_TO_ALL


def _reached(other: RankState, index: int) -> bool:
    """Has this replica launched the all-reduce at plan index `index`?"""
    if other.state == DONE:
        return True
    return other.position > index or (other.position == index and other.detail == 1)


def _named(text: str, replica: int) -> str:
    """Rename a single-pipeline message's "rank p" as "pp p / dp d"."""
    return re.sub(r"\brank(s?) (\d+)", lambda m: f"pp {m.group(2)} / dp {replica}", text)


def diagnose_mesh(states: list[RankState], spec, plan, timeout: float,
                  now: float) -> PipelineTimeout | None:
    """A PipelineTimeout naming a process by (pp, dp) if the mesh has stalled (None if not)."""
    mesh, sched = spec.mesh, spec.schedule
    stuck = [s for s in states if s.state != DONE and now - s.since > timeout]
    if not stuck:
        return None
    for s in states:
        s.pp, s.dp, _tp = mesh.coords(s.rank)
    lines = [_line(s, plan, now) for s in states]
    # 0. A process waits in an expert all-to-all (inside an action) that a peer never joined.
    for s in sorted(stuck, key=lambda s: s.since):
        if not _in_all_to_all(s):
            continue
        item = plan[s.pp][s.position].action
        for d in range(mesh.dp):
            other = states[mesh.rank(s.pp, d)]
            if d == s.dp or (_in_all_to_all(other) and other.position == s.position):
                continue
            return _error(f"pipeline timed out: {mesh.name(s.rank)} waits in an expert "
                          f"all-to-all inside {item} for {now - s.since:.1f} s (timeout "
                          f"{timeout:g} s); {mesh.name(other.rank)} never joined it: "
                          f"{_line(other, plan, now)}", other, item, now, lines, sched, states)
    # 1. A replica waits in a gradient all-reduce that another replica never reached.
    for s in sorted(stuck, key=lambda s: s.since):
        if not _in_reduction(s, plan):
            continue
        item = plan[s.pp][s.position].action
        for d in range(mesh.dp):
            other = states[mesh.rank(s.pp, d)]
            if d == s.dp or _reached(other, s.position):
                continue
            head = (f"pipeline timed out: {mesh.name(s.rank)} waits in all-reduce of stage "
                    f"{item.stage}'s gradients ({item}) for {now - s.since:.1f} s (timeout "
                    f"{timeout:g} s); dp {d} never reached it")
            inner = _in_replica(states, d, spec, plan, timeout, now)
            if inner is None:         # the absent replica is still moving: say where it is
                return _error(f"{head}: {_line(other, plan, now)}", other, item, now, lines,
                              sched, states)
            culprit, why = inner      # it is stuck itself: explain why, in its coordinates
            return _error(f"{head}, because in dp {d}: {why}", culprit.process, culprit.action,
                          now, lines, sched, states, culprit.transfer)
    # 2. A message along a pipeline: explain within the replica of the longest waiter.
    first = min(stuck, key=lambda s: s.since)
    inner = _in_replica(states, first.dp, spec, plan, timeout, now)
    if inner is None:
        return None
    culprit, why = inner
    return _error(f"pipeline timed out: {why}", culprit.process, culprit.action, now, lines,
                  sched, states, culprit.transfer)


def _in_replica(states, replica: int, spec, plan, timeout, now):
    """The single-pipeline diagnosis of one replica: (the PipelineTimeout, with `.process` the
    culprit's state, and its first line in mesh coordinates) or None if it is not stuck."""
    mesh = spec.mesh
    own = [replace(states[mesh.rank(p, replica)], rank=p) for p in range(mesh.pp)]
    inner = diagnose(own, spec.schedule, plan, timeout, now)
    if inner is None:
        return None
    inner.process = states[mesh.rank(inner.rank, replica)]
    first = _named(str(inner).splitlines()[0], replica)
    return inner, first.removeprefix("pipeline timed out: ").rstrip(".")


def _line(s: RankState, plan, now: float) -> str:
    text = describe(replace(s, rank=s.pp), plan, now)
    if _in_reduction(s, plan):
        item = plan[s.pp][s.position].action
        text = (f"rank {s.pp} waits in all-reduce of stage {item.stage}'s gradients ({item}), "
                f"for {now - s.since:.1f} s")
    elif _in_all_to_all(s):
        text = (f"rank {s.pp} waits in an expert all-to-all inside {plan[s.pp][s.position].action}"
                f" (its step {s.position}), for {now - s.since:.1f} s")
    return _named(text, s.dp)


def _error(head, culprit, action, now, lines, sched, states, transfer=None) -> PipelineTimeout:
    marks = [(s.pp, s.position) for s in states
             if s.dp == 0 and s.state == RUN and s.position < len(sched.actions[s.pp])]
    message = "\n".join([head.rstrip(".") + ".", f"In training step {culprit.step}:"] +
                        [f"  {line}" for line in lines] +
                        ["The workers were stopped; the next run starts fresh ones.", "",
                         "Replica 0's schedule:", sched.grid(mark=marks)])
    return PipelineTimeout(message, culprit.rank, action, transfer, now - culprit.since, lines)

