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
             now: float, sent: float | None = None) -> PipelineTimeout | None:
    """A PipelineTimeout if some rank has not moved for more than `timeout` seconds.

    `sent`: when the parent sent the run (the board's reset time), to tell a rank that never
    received it. The message shows the grid only around the stuck steps."""
    stuck = [s for s in states if s.state != DONE and now - s.since > timeout]
    if not stuck:
        return None
    # Follow the chain from the longest waiter (a rank in a receive or a collective): it leads
    # to the culprit and says why. Starting at a rank that is computing would explain nothing,
    # and which of the two got stuck first is up to the OS scheduler, not the schedule.
    waiting = [s for s in stuck if s.state == RECV or _collective(s, plan) is not None]
    start = min(waiting or stuck, key=lambda s: s.since)
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
    lines = [describe(s, plan, now, sent) for s in states]
    if never_started(culprit, sent):
        head = (f"pipeline timed out: rank {culprit.rank} has not received the run yet, "
                f"{waited:.1f} s after it was sent (timeout {timeout:g} s)")
    else:
        head = (f"pipeline timed out: rank {culprit.rank} made no progress for {waited:.1f} s "
                f"(timeout {timeout:g} s) in {action if action is not None else 'its step'}")
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
    marks = [(s.rank, s.position) for s in states
             if s.state in (RECV, RUN) and s.position < len(schedule.actions[s.rank])]
    grid = schedule.grid(mark=marks, window=GRID_WINDOW) if marks else \
        "(grid omitted: no rank is inside an action; print the schedule to see it)"
    message = "\n".join([head + ".", f"In training step {culprit.step}:"] +
                        [f"  {line}" for line in lines] +
                        ["The workers were stopped; the next run starts fresh ones.", "", grid])
    return PipelineTimeout(message, culprit.rank, action, transfer, waited, lines)
