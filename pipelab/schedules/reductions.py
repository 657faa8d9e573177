"""Gradient sums as actions: what a reduction waits for, what it costs, and the replica sum `G`.

Two kinds sum gradients over several copies of the same weights. `AR` (techniques/
data_parallel.py) sums a stage over the data-parallel replicas of the whole pipeline. `G`
sums a model part over its *weight replicas* inside one pipeline: the two stages, on two
ranks, that compute the same part in a bidirectional schedule (DualPipe, Chimera; routes.py).
Both read the accumulated `.grad` (local state), so they wait, by ordering edges that never
become messages, for every gradient-producing pass of their stages (W where the backward is
split, else B); both run on the communication lane and cost a ring all-reduce.

`sG` is a collective of the ranks holding the part stage s computes; write it with the lowest
such stage (the one on route 0), on every one of those ranks.
"""
from __future__ import annotations

from .actions import NO_MICROBATCH, Action
from .kinds import REDUCTION, Input, gradient_edges, gradient_passes, register_kind

REPLICA_SUM = "G"      # the kind's name: the validator and the runtime look for it by this


def allreduce_time(nbytes: float, replicas: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring all-reduce of `nbytes` over `replicas` processes: 2(n−1)·latency + 2(n−1)/n · bytes /
    bandwidth. A reduce-scatter then an all-gather, n−1 rounds each: every round costs one
    message latency and moves 1/n of the buffer (nothing to do for n=1)."""
    if replicas <= 1:
        return 0.0
    rounds = 2 * (replicas - 1)
    return rounds * latency + rounds / replicas * nbytes / bandwidth


def gradient_inputs(schedule, stages) -> list[Input]:
    """Ordering edges to every pass that adds to the weight gradients of `stages`."""
    kinds = gradient_passes(schedule)
    return gradient_edges(schedule, ((s, mb) for s in stages for mb in range(schedule.microbatches)
                                     if (s, mb) in kinds or schedule.routes is None))


def replica_stages(schedule, stage: int) -> list[int]:
    """Every stage computing the same model part as `stage` (itself included)."""
    part = schedule.slice_of(stage)
    return [s for s in range(len(schedule.placement)) if schedule.slice_of(s) == part]


def _replica_members(schedule, a: Action) -> tuple[int, ...]:
    return tuple(sorted({schedule.placement[s] for s in replica_stages(schedule, a[0])}))


def _replica_cost(costs, stage: int) -> float:
    return allreduce_time(costs.of_parameter_bytes(stage), 2, costs.bandwidth, costs.latency)


register_kind(REPLICA_SUM, "sum of a model part's gradients over its weight replicas",
              inputs=lambda schedule, a: gradient_inputs(schedule, replica_stages(schedule, a[0])),
              per_microbatch=False, members=_replica_members, lane="comm", cost=_replica_cost,
              module="pipelab", role=REDUCTION, label="replica sum")


def replica_sum(stage: int) -> Action:
    """The action `<stage>G`."""
    return Action(stage, REPLICA_SUM, NO_MICROBATCH)
