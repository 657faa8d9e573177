"""Communication, derived from a schedule: who sends what to whom, and when.

A compute action consumes the output of actions on neighbouring stages (a forward needs the
previous stage's activation, a backward the next stage's input gradient). When producer and
consumer live on different ranks, the producer's rank sends right after the producer runs and
the consumer's rank receives right before the consumer runs. Sends never block, so a schedule
that passes the dry run in `validate.py` cannot deadlock on communication.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .actions import Action

MAX_STAGES = 4096


@dataclass(frozen=True)
class Transfer:
    """One tensor crossing ranks: the output of `producer` needed by `consumer`."""
    producer: Action
    consumer: Action
    src: int            # rank that sends
    dst: int            # rank that receives

    @property
    def what(self) -> str:
        return "activation" if self.producer.kind == "F" else "gradient"

    @property
    def tag(self) -> int:
        # Unique per (stage boundary, direction, microbatch), so messages can never be confused;
        # comm_plan refuses schedules with MAX_STAGES stages or more, where this would collide.
        direction = 0 if self.producer.kind == "F" else 1
        return (self.producer.microbatch * MAX_STAGES + self.producer.stage) * 2 + direction

    def __str__(self) -> str:
        return f"{self.what} {self.producer}->{self.consumer} (rank {self.src}->{self.dst})"


@dataclass
class Step:
    """One compute action with the receives it waits for and the sends that follow it."""
    action: Action
    recv: list[Transfer] = field(default_factory=list)
    send: list[Transfer] = field(default_factory=list)


def consumers(schedule, action: Action) -> list[Action]:
    """Actions on other stages that read `action`'s output."""
    s, m = action.stage, action.microbatch
    if action.kind == "F" and s < schedule.stages - 1:
        return [Action(s + 1, "F", m)]
    if action == schedule.input_grad_action(s, m) and s > 0:
        return [schedule.input_grad_action(s - 1, m)]
    return []


def comm_plan(schedule) -> list[list[Step]]:
    """For each rank, its actions in order, each with the transfers around it."""
    if schedule.stages >= MAX_STAGES:
        raise ValueError(f"schedule: {schedule.stages} stages; message tags support fewer than "
                         f"{MAX_STAGES}")
    place = schedule.placement
    plan = []
    for rank, acts in enumerate(schedule.actions):
        steps = []
        for a in acts:
            recv = [Transfer(d, a, place[d.stage], rank)
                    for d in schedule.dependencies(a)
                    if d.stage != a.stage and place[d.stage] != rank]
            send = [Transfer(a, c, rank, place[c.stage])
                    for c in consumers(schedule, a) if place[c.stage] != rank]
            steps.append(Step(a, recv, send))
        plan.append(steps)
    return plan
