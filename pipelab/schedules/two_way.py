"""The two-way pipeline DualPipe and Chimera share: two routes through the model in opposite
directions on the V placement, each model part held twice and its gradients summed at the end."""
from __future__ import annotations

from .base import Schedule
from .placement import v_placement
from .reductions import replica_sum


def two_way(actions: list, ranks: int, microbatches: int, name: str):
    """A bidirectional schedule on the V placement (DualPipe, Chimera): route 0 is stages
    0..p−1, stage k on rank k; route 1 is stages p..2p−1, stage p+k computing part k on rank
    p−1−k. Each rank's `actions` are ended with the replica sums of its two parts, in the same
    order on both ranks of a pair, once both copies' gradients are complete."""
    p = ranks
    for r in range(p):
        actions[r] += [replica_sum(part) for part in sorted({r, p - 1 - r})]
    return Schedule(actions, placement=v_placement(p), microbatches=microbatches, name=name,
                    routes=(tuple(range(p)), tuple(range(p, 2 * p))), slices=tuple(range(p)) * 2)
