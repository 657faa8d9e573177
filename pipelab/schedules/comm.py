"""Communication, derived from a schedule: who sends what to whom, and when.

Every input edge that carries a tensor (kinds.py) between actions on different ranks is a
message. The producer's rank sends right after the producer runs; the consumer's rank
receives right before the consumer runs. Sends never block, so a schedule that passes the dry
run in graph.py cannot deadlock on communication. Each message has its own tag, numbered in
one deterministic pass, so two messages can never be confused whatever the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .actions import Action
from .graph import members_of
from .kinds import KIND_SPECS


@dataclass(frozen=True)
class Transfer:
    """One tensor crossing ranks: the output of `producer`, read by `consumer` as `name`."""
    producer: Action
    consumer: Action
    src: int            # rank that sends
    dst: int            # rank that receives
    name: str = "x"     # the input's name in the consumer's handler
    tag: int = 0

    @property
    def what(self) -> str:
        """What travels: the producer kind's output, e.g. "activation" or "input gradient"."""
        return KIND_SPECS[self.producer.kind].output or f"output of {self.producer.kind}"

    def __str__(self) -> str:
        return f"{self.what} {self.producer}->{self.consumer} (rank {self.src}->{self.dst})"


@dataclass
class Step:
    """One step of a rank (an action or a compound) with the receives it waits for, the sends
    that follow it, and how many later actions on the same rank read each part's output."""
    action: object
    recv: list[Transfer] = field(default_factory=list)
    send: list[Transfer] = field(default_factory=list)
    keep: dict[Action, int] = field(default_factory=dict)


def _ranks_running(schedule, action: Action, placement) -> tuple[int, ...]:
    members = members_of(schedule, action)
    return members if members is not None else (placement[action.stage],)


def comm_plan(schedule) -> list[list[Step]]:
    """For each rank, its steps in order, each with the transfers around it."""
    place = schedule.placement
    plan = [[Step(item) for item in acts] for acts in schedule.actions]
    position: dict[Action, dict[int, int]] = {}
    for rank, acts in enumerate(schedule.actions):
        for index, item in enumerate(acts):
            for part in item.parts:
                position.setdefault(part, {})[rank] = index
    tag = 0
    for rank, acts in enumerate(schedule.actions):
        for index, item in enumerate(acts):
            for part in item.parts:
                for name, producer, carries in schedule.inputs(part):
                    if not carries:
                        continue
                    runs_on = position.get(producer, {})
                    if rank in runs_on:           # produced on this rank: handed over in memory
                        keep = plan[rank][runs_on[rank]].keep
                        keep[producer] = keep.get(producer, 0) + 1
                        continue
                    ranks = _ranks_running(schedule, producer, place)
                    src = ranks[0] if place[producer.stage] not in ranks else place[producer.stage]
                    transfer = Transfer(producer, part, src, rank, name, tag)
                    tag += 1
                    plan[rank][index].recv.append(transfer)
                    if src in runs_on:
                        plan[src][runs_on[src]].send.append(transfer)
    return plan
