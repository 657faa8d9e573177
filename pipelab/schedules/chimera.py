"""Chimera (Li & Hoefler, SC21, arXiv 2107.06925): two pipelines in opposite directions.

p ranks (p even) carry two pipelines over the same p stages: the *down* pipeline has stage k on
rank k, the *up* pipeline stage k on rank p−1−k, so every rank holds one stage of each — two
copies of the weights, summed by `G` at the end of the step. Half the microbatches go down,
half go up. Where one direction's pipeline has its fill-and-drain bubble on a rank, the other
is busy there: the bubble per rank falls from 1F1B's (p−1)(F+B) to (p/2−1)(F+B), a bubble
fraction of (p−2)/(2m+p−2) in the paper's slot count (one slot = F + B).

The paper draws the schedule of one "basic unit" (m = p) and repeats it for more microbatches.
We get it from the rule its figure follows, played on the figure's slots (a forward and a
backward one slot each): every rank, in every slot, runs the ready action of the *oldest*
microbatch of its own pipeline (its index within its direction; a backward before a forward,
down before up on a tie). Each direction's first microbatch then flows through unobstructed,
the others fill in behind, and every rank holds at most p microbatch-stages. The rule only
decides each rank's order; the simulator and the runtime run that order under whatever costs
they are given. (With a backward twice a forward the same order leaves more than the slot
count's bubble: the paper's closed form assumes equal slots.)
"""
from __future__ import annotations

import heapq

from .actions import Action
from .base import Schedule
from .registry import register
from .two_way import two_way

DOWN, UP = 0, 1


def _slot_order(p: int, m: int) -> list[list[Action]]:
    """Each rank's actions under the rule of the module docstring, slot by slot."""
    half = m // 2

    def rank_of(direction: int, hop: int) -> int:          # hop: position along the route
        return hop if direction == DOWN else p - 1 - hop

    def stage_of(direction: int, hop: int) -> int:
        return hop if direction == DOWN else p + hop

    # ready[rank]: heap of (index in its pipeline, 0 for B / 1 for F, direction, hop)
    ready: list[list] = [[] for _ in range(p)]
    for d in (DOWN, UP):
        for j in range(half):
            heapq.heappush(ready[rank_of(d, 0)], (j, 1, d, 0))
    actions: list[list[Action]] = [[] for _ in range(p)]
    left = 2 * m * p
    while left:
        enabled = []
        for rank in range(p):
            if not ready[rank]:
                continue                       # a bubble slot
            j, backward_last, d, hop = heapq.heappop(ready[rank])
            forward = backward_last == 1
            actions[rank].append(Action(stage_of(d, hop), "F" if forward else "B",
                                        j + half * d))
            left -= 1
            if forward:                        # on to the next stage, or turn at the route's end
                enabled.append((j, 1, d, hop + 1) if hop < p - 1 else (j, 0, d, hop))
            elif hop > 0:
                enabled.append((j, 0, d, hop - 1))
        for item in enabled:                   # what this slot finished is ready in the next
            heapq.heappush(ready[rank_of(item[2], item[3])], item)
    return actions


@register("chimera")
def chimera(ranks: int, microbatches: int) -> Schedule:
    """Two 1F1B pipelines in opposite directions over the same ranks (module docstring)."""
    if ranks % 2:
        raise ValueError(f"chimera needs an even number of ranks (rank r holds the down "
                         f"pipeline's stage r and the up pipeline's stage p-1-r), got "
                         f"ranks={ranks}")
    if microbatches % ranks:
        raise ValueError(f"chimera needs microbatches to be a multiple of ranks ({ranks}): its "
                         f"basic unit sends ranks/2 microbatches each way, got "
                         f"microbatches={microbatches}")
    return two_way(_slot_order(ranks, microbatches), ranks, microbatches, name="chimera")
