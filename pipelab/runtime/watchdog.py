"""Turn a stalled progress board into an explanation: who is stuck, where, waiting for what.

A rank blocked in a receive is usually a victim: follow what it waits for (the sending rank)
until reaching a rank that is not waiting for a message (it is computing, or it already sent
what was asked and the message was lost). That rank, or the oldest waiter of a cycle of waits,
is the one named.
"""
from __future__ import annotations

from ..schedules.graph import members_of
from ..schedules.kinds import KIND_SPECS
from .board import DONE, OPTIM, RECV, RUN, SENDS, SETUP, SYNC, RankState
from .errors import PipelineTimeout


def _collective(state: RankState, plan):
    """The collective step a running rank is in, or None."""
    if state.state != RUN or state.position >= len(plan[state.rank]):
        return None
    item = plan[state.rank][state.position].action
    return item if KIND_SPECS[item.parts[0].kind].collective else None


def _absent_member(states: list[RankState], item, schedule, plan):
    """A member rank of a collective that has not reached it (None if all are there)."""
    for member in members_of(schedule, item.parts[0]):
        other = states[member]
        index = next((i for i, s in enumerate(plan[member]) if s.action == item), None)
        if other.state != DONE and index is not None and other.position < index:
            return other
    return None


def _transfer(state: RankState, plan):
    return plan[state.rank][state.position].recv[state.detail]


def _already_ran(sender: RankState, producer, plan, step: int) -> bool:
    index = next(i for i, s in enumerate(plan[sender.rank]) if producer in s.action.parts)
    return sender.step > step or sender.state in (SENDS, DONE) or \
        (sender.step == step and sender.position > index)


GRID_WINDOW = 4     # steps of the grid shown either side of the stuck ones
# Where a process is in its step, for comparing two of them: the state's order within a
# position (the step barrier, then the receives, then the compute; the sends and the optimizer
# come after the last action, at position len(plan)).
_ORDER = {SETUP: 0, SYNC: 1, RECV: 2, RUN: 3, SENDS: 4, OPTIM: 5, DONE: 6}


def progress(state: RankState) -> tuple[int, int, int]:
    """How far a process has come: (training step, position, state order); DONE is last."""
    if state.state == DONE:
        return (1 << 62, 0, 0)
    return (state.step, state.position, _ORDER.get(state.state, 0))


def is_stopped(pid: int | None) -> bool:
    """Whether a process is stopped (SIGSTOP, Ctrl-Z, a debugger): state T or t in
    /proc/<pid>/stat. Its progress row then says where it was, not that it is waiting."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


# The longest a run may stay in set-up (building stages, joining process groups) with no
# process stopped: set-up is not under the no-progress timeout (see `stalled`), but is bounded.
SETUP_LIMIT = 60.0


def stalled(states: list[RankState], now: float, timeout: float, stopped) -> bool:
    """Whether the parent should explain a stall now: no process has moved for `timeout`.

    The no-progress clock runs only once every process has finished setting up: set-up (building
    the stages, joining process groups) has no progress marks and can take seconds on a busy
    machine, so while a process is still in it only a stopped process (`stopped()`, read only
    then) or SETUP_LIMIT ends the wait. A process stopped during set-up is then named at once
    instead of whichever one happened to enter set-up first."""
    active = [s for s in states if s.state != DONE]
    if not active or not all(now - s.since > timeout for s in active):
        return False
    if any(s.state == SETUP for s in active):
        return bool(stopped()) or all(now - s.since > max(timeout, SETUP_LIMIT) for s in active)
    return True


def setting_up(states: list[RankState]) -> list[RankState]:
    """The processes still setting up while every other one has finished and waits for them at
    the first step's barrier: the ones that hold the run up (none when all are setting up)."""
    behind = [s for s in states if s.state == SETUP]
    ready = [s for s in states if s.state != SETUP]
    return behind if ready and all(s.state == SYNC and s.step == 0 for s in ready) else []


def ready_since(states: list[RankState]) -> float:
    """When the last process that finished setting up did so (the clock of the ones still
    setting up starts there: until then they were not late)."""
    return max(s.since for s in states if s.state != SETUP)


def never_started(state: RankState, sent: float | None) -> bool:
    """The rank has not received the run: it is still in the SETUP state the parent wrote when
    it sent the run (at `sent`); a worker that gets the run writes SETUP again, at a later time."""
    return sent is not None and state.state == SETUP and state.since == sent


def describe(state: RankState, plan, now: float, sent: float | None = None) -> str:
    """One line saying what a rank is doing and for how long."""
    r, dt, acts = state.rank, now - state.since, plan[state.rank]
    if never_started(state, sent):
        return (f"rank {r} has not received the run yet ({dt:.1f} s after it was sent): its "
                f"worker is busy or blocked outside the pipeline")
    if state.state == RECV:
        t = _transfer(state, plan)
        return (f"rank {r} waits in {acts[state.position].action} (its step {state.position}) "
                f"for the {t.what} {t.producer}->{t.consumer} from rank {t.src}, for {dt:.1f} s")
    if state.state == RUN and _collective(state, plan) is not None:
        item = acts[state.position].action
        return (f"rank {r} waits in {item} ({KIND_SPECS[item.kind].description}, a collective), "
                f"its step {state.position}, for {dt:.1f} s")
    if state.state == RUN:
        return (f"rank {r} is running {acts[state.position].action} (its step {state.position}) "
                f"for {dt:.1f} s: computing, not waiting for a message")
    text = {SETUP: "is building its stages", SENDS: "has run all its actions and waits for "
            "its last sends to be received", SYNC: "waits at the barrier that starts the "
            "training step", OPTIM: "is in the optimizer step", DONE: "has finished"}
    return f"rank {r} {text.get(state.state, 'is in an unknown state')} ({dt:.1f} s)"


def diagnose(states: list[RankState], schedule, plan, timeout: float,
             now: float, sent: float | None = None,
             stopped: frozenset = frozenset(),
             first: int | None = None) -> PipelineTimeout | None:
    """A PipelineTimeout if some rank has not moved for more than `timeout` seconds.

    `sent`: when the parent sent the run (the board's reset time), to tell a rank that never
    received it. `stopped`: the ranks whose process is stopped (`is_stopped`): one of them is
    named before any chain of waits is followed (its row looks like a wait, or like work).
    `first`: the rank to follow the chain of waits from (default: the longest waiter).
    The message shows the grid only around the stuck steps."""
    stuck = [s for s in states if s.state != DONE and now - s.since > timeout]
    if not stuck:
        return None
    frozen = [s for s in stuck if s.rank in stopped]
    late = setting_up(states)
    if frozen or late:
        culprit = min(frozen or late, key=lambda s: s.since)
        return _held_up(culprit, states, schedule, plan, timeout, now, sent, bool(frozen))
    # Follow the chain from the longest waiter (a rank in a receive or a collective): it leads
    # to the culprit and says why. Starting at a rank that is computing would explain nothing,
    # and which of the two got stuck first is up to the OS scheduler, not the schedule.
    waiting = [s for s in stuck if s.state == RECV or _collective(s, plan) is not None]
    start = states[first] if first is not None else min(waiting or stuck, key=lambda s: s.since)
    chain, culprit, lost, absent_from, cycle = [], start, None, None, False
    while True:
        if culprit.rank in chain:
            cycle = True
            break
        chain.append(culprit.rank)
        item = _collective(culprit, plan)
        if item is not None:          # in a collective: blame a member that never came
            other = _absent_member(states, item, schedule, plan)
            if other is None:
                break
            absent_from = (culprit.rank, item, other.rank)
            culprit = other
            continue
        if culprit.state != RECV:
            break
        transfer = _transfer(culprit, plan)
        sender = states[transfer.src]
        if _already_ran(sender, transfer.producer, plan, culprit.step):
            lost = transfer           # it was produced: the message itself never arrived
            break
        culprit = sender
    if cycle:
        culprit = start               # a cycle of waits: name the rank that has waited longest
    action = schedule.actions[culprit.rank][culprit.position] \
        if culprit.position < len(schedule.actions[culprit.rank]) else None
    transfer = _transfer(culprit, plan) if culprit.state == RECV else None
    waited = now - culprit.since
    head = _head(culprit, action, waited, timeout, sent)
    if transfer is not None:
        head += f", waiting for the {transfer.what} {transfer.producer}->{transfer.consumer} " \
                f"from rank {transfer.src}"
    elif culprit.state == RUN:
        head += " while computing (not waiting for any message)"
    if lost is not None:
        head += f"; rank {lost.src} already ran {lost.producer}, so its message was lost"
    if absent_from is not None:
        waiter, item, absent = absent_from
        head += (f"; rank {waiter} waits in {item} ({KIND_SPECS[item.kind].description}), "
                 f"which rank {absent} has not reached")
    return _timeout(head, culprit, action, transfer, waited, states, schedule, plan, now, sent)


def _head(culprit: RankState, action, waited: float, timeout: float, sent) -> str:
    if never_started(culprit, sent):
        return (f"pipeline timed out: rank {culprit.rank} has not received the run yet, "
                f"{waited:.1f} s after it was sent (timeout {timeout:g} s)")
    return (f"pipeline timed out: rank {culprit.rank} made no progress for {waited:.1f} s "
            f"(timeout {timeout:g} s) in {action if action is not None else 'its step'}")


def _held_up(culprit: RankState, states, schedule, plan, timeout: float, now: float, sent,
             frozen: bool) -> PipelineTimeout:
    """The error for a rank that holds everyone up by itself: its process is stopped, or it is
    still setting up while the others wait for it at the first barrier (its clock then starts
    when the last of them got there)."""
    acts = schedule.actions[culprit.rank]
    action = acts[culprit.position] if culprit.position < len(acts) else None
    doing = describe(culprit, plan, now, sent).split(" ", 2)[2]     # without "rank N"
    if frozen:
        waited = now - culprit.since
        head = (f"pipeline timed out: rank {culprit.rank} is stopped (its process is in state "
                f"T: a SIGSTOP, Ctrl-Z or a debugger holds it) and made no progress for "
                f"{waited:.1f} s (timeout {timeout:g} s); its last progress: {doing}")
    elif never_started(culprit, sent):
        waited = now - culprit.since
        head = _head(culprit, action, waited, timeout, sent)
    else:
        waited = now - ready_since(states)
        head = (f"pipeline timed out: rank {culprit.rank} has not finished setting up its "
                f"stages {waited:.1f} s after every other rank was ready (timeout "
                f"{timeout:g} s)")
    transfer = _transfer(culprit, plan) if culprit.state == RECV else None
    return _timeout(head, culprit, action, transfer, waited, states, schedule, plan, now, sent)


def _timeout(head: str, culprit: RankState, action, transfer, waited: float, states, schedule,
             plan, now: float, sent) -> PipelineTimeout:
    lines = [describe(s, plan, now, sent) for s in states]
    marks = [(s.rank, s.position) for s in states
             if s.state in (RECV, RUN) and s.position < len(schedule.actions[s.rank])]
    grid = schedule.grid(mark=marks, window=GRID_WINDOW) if marks else \
        "(grid omitted: no rank is inside an action; print the schedule to see it)"
    message = "\n".join([head + ".", f"In training step {culprit.step}:"] +
                        [f"  {line}" for line in lines] +
                        ["The workers were stopped; the next run starts fresh ones.", "", grid])
    return PipelineTimeout(message, culprit.rank, action, transfer, waited, lines)
