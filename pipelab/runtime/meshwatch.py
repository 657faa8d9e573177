"""A stalled mesh explained: which process, by its coordinates (pp / dp / tp), waits, and in what.

On a mesh of pp × dp × tp processes a step can stall in four ways: a message along one
pipeline (the single-pipeline watchdog explains that, read in the pipeline's own coordinates:
replica d, shard t), a gradient all-reduce whose replicas do not all arrive ("pp 1 / dp 0 waits
in all-reduce of stage 1's gradients (1AR); dp 1 never reached it: it is running 1AR"), an
expert all-to-all inside an action that a peer of the data-parallel group never joins, and a
tensor-parallel all-reduce inside an action that a shard of the same pipeline rank has not
reached. The last one leaves no mark on the progress board (the shards look busy in their
action), so it is read from the shards' progress: a shard that is running an action while
another shard of its pipeline rank is behind it waits for that shard, and the chain of waits
continues from there. A process that is stopped, or still setting up while every other one
waits at the first barrier, is named before any chain is followed (watchdog.py).
"""
from __future__ import annotations

import re
from dataclasses import replace

from .board import DONE, IN_ALL_TO_ALL, IN_REDUCTION, RUN, RankState
from .collectives import ALL_REDUCE
from .errors import PipelineTimeout
from .watchdog import describe, diagnose, never_started, progress, ready_since, setting_up


def _in_reduction(state: RankState, plan) -> bool:
    """Waiting inside a gradient all-reduce (launched, not complete): detail 1 at an AR step."""
    steps = plan[state.pp]
    return state.state == RUN and state.detail == IN_REDUCTION and state.position < len(steps) and \
        steps[state.position].action.parts[0].kind == ALL_REDUCE


def _in_all_to_all(state: RankState) -> bool:
    return state.state == RUN and state.detail == IN_ALL_TO_ALL


def _reached(other: RankState, index: int) -> bool:
    """Has this replica launched the all-reduce at plan index `index`?"""
    if other.state == DONE:
        return True
    return other.position > index or (other.position == index and other.detail == IN_REDUCTION)


def _named(text: str, mesh, dp: int, tp: int) -> str:
    """Rename a single-pipeline message's "rank p" as the process's coordinates in replica
    `dp`, shard `tp` ("pp p / dp d", "pp p / tp t", "pp p / dp d / tp t")."""
    return re.sub(r"\brank(s?) (\d+)", lambda m: mesh.name(mesh.rank(int(m.group(2)), dp, tp)),
                  text)


def diagnose_mesh(states: list[RankState], spec, plan, timeout: float, now: float,
                  sent: float | None = None,
                  stopped: frozenset = frozenset()) -> PipelineTimeout | None:
    """A PipelineTimeout naming a process by its coordinates if the mesh has stalled (None if
    not). `sent` and `stopped` as for watchdog.diagnose (`stopped` holds process indices)."""
    mesh, sched = spec.mesh, spec.schedule
    stuck = [s for s in states if s.state != DONE and now - s.since > timeout]
    if not stuck:
        return None
    for s in states:
        s.pp, s.dp, s.tp = mesh.coords(s.rank)
    lines = [_line(s, plan, now, mesh, sent, s.rank in stopped) for s in states]
    # A process that holds everyone up by itself: stopped, or still setting up.
    frozen = [s for s in stuck if s.rank in stopped]
    late = setting_up(states)
    if frozen or late:
        culprit = min(frozen or late, key=lambda s: s.since)
        return _held_up(culprit, bool(frozen), states, spec, plan, timeout, now, sent, lines)
    # 0. A process waits in an expert all-to-all (inside an action) that a peer never joined.
    for s in sorted(stuck, key=lambda s: s.since):
        if not _in_all_to_all(s):
            continue
        item = plan[s.pp][s.position].action
        for d in range(mesh.dp):
            other = states[mesh.rank(s.pp, d, s.tp)]
            if d == s.dp or (_in_all_to_all(other) and other.position == s.position):
                continue
            return _error(f"pipeline timed out: {mesh.name(s.rank)} waits in an expert "
                          f"all-to-all inside {item} for {now - s.since:.1f} s (timeout "
                          f"{timeout:g} s); {mesh.name(other.rank)} never joined it: "
                          f"{_line(other, plan, now, mesh, sent)}", other, item, now, lines,
                          sched, states)
    # 1. A replica waits in a gradient all-reduce that another replica never reached.
    for s in sorted(stuck, key=lambda s: s.since):
        if not _in_reduction(s, plan):
            continue
        item = plan[s.pp][s.position].action
        for d in range(mesh.dp):
            other = states[mesh.rank(s.pp, d, s.tp)]
            if d == s.dp or _reached(other, s.position):
                continue
            head = (f"pipeline timed out: {mesh.name(s.rank)} waits in all-reduce of stage "
                    f"{item.stage}'s gradients ({item}) for {now - s.since:.1f} s (timeout "
                    f"{timeout:g} s); dp {d} never reached it")
            inner = _follow(states, d, s.tp, spec, plan, timeout, now, sent)
            if inner is None:         # the absent replica is still moving: say where it is
                return _error(f"{head}: {_line(other, plan, now, mesh, sent)}", other, item,
                              now, lines, sched, states)
            culprit, why = inner      # it is stuck itself: explain why, in its coordinates
            return _error(f"{head}, because in dp {d}: {why}", culprit.process, culprit.action,
                          now, lines, sched, states, culprit.transfer)
    # 2. A message along a pipeline, or a shard behind: from the longest waiter's pipeline.
    first = min(stuck, key=lambda s: s.since)
    inner = _follow(states, first.dp, first.tp, spec, plan, timeout, now, sent)
    if inner is None:
        return None
    culprit, why = inner
    return _error(f"pipeline timed out: {why}", culprit.process, culprit.action, now, lines,
                  sched, states, culprit.transfer)


def _follow(states, dp: int, tp: int, spec, plan, timeout, now, sent, start=None,
            seen: frozenset = frozenset()):
    """The chain of waits in the pipeline of replica `dp`, shard `tp` (from its pipeline rank
    `start`, else from its longest waiter), continued into another shard's pipeline where it
    ends at a process running an action while a shard of its pipeline rank is behind it
    (that process waits for the shard in a tensor-parallel all-reduce). (the PipelineTimeout,
    with `.process` the culprit's state, and its first line in mesh coordinates) or None."""
    mesh = spec.mesh
    inner = _in_pipeline(states, dp, tp, spec, plan, timeout, now, sent, start)
    if inner is None or mesh.tp == 1:
        return inner
    culprit, why = inner
    proc = culprit.process
    behind = [states[mesh.rank(proc.pp, dp, t)] for t in range(mesh.tp)
              if progress(states[mesh.rank(proc.pp, dp, t)]) < progress(proc)]
    if proc.state != RUN or not behind or (dp, tp) in seen:
        return inner
    lag = min(behind, key=progress)
    deeper = _follow(states, dp, lag.tp, spec, plan, timeout, now, sent, lag.pp,
                     seen | {(dp, tp)})
    if deeper is None:
        return inner
    action = plan[proc.pp][proc.position].action
    return deeper[0], (f"{mesh.name(proc.rank)} waits in a tensor-parallel all-reduce inside "
                       f"{action} for {mesh.name(lag.rank)}, which is behind it: {deeper[1]}")


def _in_pipeline(states, dp: int, tp: int, spec, plan, timeout, now, sent, start=None):
    """The single-pipeline diagnosis of one pipeline (replica `dp`, shard `tp`): (the
    PipelineTimeout, with `.process` the culprit's state, and its first line in mesh
    coordinates) or None if it is not stuck."""
    mesh = spec.mesh
    own = [replace(states[mesh.rank(p, dp, tp)], rank=p) for p in range(mesh.pp)]
    inner = diagnose(own, spec.schedule, plan, timeout, now, sent, first=start)
    if inner is None:
        return None
    inner.process = states[mesh.rank(inner.rank, dp, tp)]
    first = _named(str(inner).splitlines()[0], mesh, dp, tp)
    return inner, first.removeprefix("pipeline timed out: ").rstrip(".")


def _held_up(culprit: RankState, frozen: bool, states, spec, plan, timeout, now, sent,
             lines) -> PipelineTimeout:
    """A stopped process, or one still setting up while the others wait (watchdog._held_up)."""
    mesh, acts = spec.mesh, spec.schedule.actions[culprit.pp]
    action = acts[culprit.position] if culprit.position < len(acts) else None
    who = f"{mesh.name(culprit.rank)} (process {culprit.rank})"
    if frozen:
        head = (f"pipeline timed out: {who} is stopped (its process is in state T: a SIGSTOP, "
                f"Ctrl-Z or a debugger holds it) and made no progress for "
                f"{now - culprit.since:.1f} s (timeout {timeout:g} s); its last progress: "
                f"{_doing(culprit, plan, now, mesh, sent)}")
    elif never_started(culprit, sent):
        head = (f"pipeline timed out: {who} has not received the run yet, "
                f"{now - culprit.since:.1f} s after it was sent (timeout {timeout:g} s)")
    else:
        head = (f"pipeline timed out: {who} has not finished setting up its stages "
                f"{now - ready_since(states):.1f} s after every other process was ready "
                f"(timeout {timeout:g} s)")
    return _error(head, culprit, action, now, lines, spec.schedule, states)


def _line(s: RankState, plan, now: float, mesh, sent=None, frozen: bool = False) -> str:
    """One line on a process: its coordinates, then what it does."""
    return (f"{mesh.name(s.rank)} {_doing(s, plan, now, mesh, sent)}"
            + (" [its process is stopped]" if frozen else ""))


def _doing(s: RankState, plan, now: float, mesh, sent=None) -> str:
    """What a process does ("waits in 1F2 (its step 3) for ... from pp 0 / tp 1, for 2.0 s"),
    other processes named by their coordinates."""
    if _in_reduction(s, plan):
        item = plan[s.pp][s.position].action
        text = (f"waits in all-reduce of stage {item.stage}'s gradients ({item}), "
                f"for {now - s.since:.1f} s")
    elif _in_all_to_all(s):
        text = (f"waits in an expert all-to-all inside {plan[s.pp][s.position].action}"
                f" (its step {s.position}), for {now - s.since:.1f} s")
    else:          # the watchdog's line without its leading "rank N"
        text = describe(replace(s, rank=s.pp), plan, now, sent).split(" ", 2)[2]
    return _named(text, mesh, s.dp, s.tp)


def _error(head, culprit, action, now, lines, sched, states, transfer=None) -> PipelineTimeout:
    marks = [(s.pp, s.position) for s in states if s.dp == 0 and s.tp == 0
             and s.state == RUN and s.position < len(sched.actions[s.pp])]
    message = "\n".join([head.rstrip(".") + ".", f"In training step {culprit.step}:"] +
                        [f"  {line}" for line in lines] +
                        ["The workers were stopped; the next run starts fresh ones.", "",
                         "Replica 0's schedule:", sched.grid(mark=marks)])
    return PipelineTimeout(message, culprit.rank, action, transfer, now - culprit.since, lines)
