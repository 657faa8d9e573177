"""V-Half and V-Min: V-shaped schedules with controllable memory (Qi, Wan, Amar, Lin, "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, arXiv 2405.15362; the authors' generator is
`zbv_greedy.py` in sail-sg/zero-bubble-pipeline-parallelism).

The paper's idea: a steady pipeline repeats one *building block* — each rank's F, I and W of
one microbatch — every `interval` time slots. A microbatch's activations live on a rank from its
forward to its weight gradient (the block's *lifespan*), so the peak a rank holds is about
lifespan / interval microbatches. ZB-V's block lives ~6p slots at interval 6: peak p. Packing the
block tighter shortens the lifespan:

    rank r's block (slots; chunk 0 = stage r going down, chunk 1 = stage 2p−1−r coming up)
                 F chunk 0    F chunk 1       I chunk 1             I chunk 0
    V-Half       2r           3p − r − 2      3p + g + 2r − 1       6p + g − r − 2     g = 3 if p even else 0
    V-Min        r            2p − r − 1      2p + g + r            4p + g − r − 1     g = 2 if 3 | p else 0

The down-going forward steps two slots a rank in V-Half (one in V-Min); each rank's two chunks
together live about 6p·½ (V-Half) or 4p·⅓ (V-Min) of the steady interval, the same on every rank:
the peak is ⌊(p+2)/2⌋ or ⌊(p+4)/3⌋ microbatches of a rank's layers, balanced. (`g` keeps two
blocks from claiming one slot.) Each W fills the first free slot after its I, the I's of the
older microbatch first. Repeating the block every 6 slots for m microbatches and reading each
rank's slots in order gives its action list; the simulator (and a live run) then starts each
action as soon as its inputs arrive — the paper's "squeeze", which closes the warm-up gaps.

Units: the simulator counts activations in a rank's worth of layers; a chunk is half of it, so
one chunk forward adds ½. Bubble at F = I = W: V-Half leaves about half of 1F1B's, V-Min about
two thirds (the README's table); V-Half has no bubble in its steady state when W + 2I ≥ 2F and
W + 2F ≥ 2I (the paper's condition, our I being its B). Unlike the authors' greedy pass we do not
move warm-up and cool-down actions into earlier free slots; the bubble is therefore a little
above theirs at small m (tests/test_v_shape.py pins ours).
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from .actions import F, I, W, Action
from .base import Schedule
from .placement import v_placement
from .registry import register

INTERVAL = 6        # slots between one microbatch's block and the next: 2 F, 2 I, 2 W per rank


def v_half_block(ranks: int) -> list[tuple[int, int, int, int]]:
    """Each rank's slots (F chunk 0, F chunk 1, I chunk 1, I chunk 0) of microbatch 0 in V-Half."""
    p = ranks
    gap = 3 if p % 2 == 0 else 0
    return [(2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2) for r in range(p)]


def v_min_block(ranks: int) -> list[tuple[int, int, int, int]]:
    """Each rank's slots (F chunk 0, F chunk 1, I chunk 1, I chunk 0) of microbatch 0 in V-Min."""
    p = ranks
    gap = 2 if p % 3 == 0 else 0
    return [(r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1) for r in range(p)]


def _rank_actions(rank: int, ranks: int, microbatches: int,
                  block: tuple[int, int, int, int]) -> list[Action]:
    """Repeat the rank's block every INTERVAL slots, then put each owed W in the next free slot."""
    down, up = rank, 2 * ranks - 1 - rank
    makers = (F, F, I, I)
    stages = (down, up, up, down)
    slots: dict[int, Action] = {}
    for mb in range(microbatches):
        for offset, make, stage in zip(block, makers, stages):
            slots[offset + INTERVAL * mb] = make(stage, mb)
    acts: list[Action] = []
    owed: deque[Action] = deque()
    for slot in range(max(slots) + 1):
        action = slots.get(slot)
        if action is not None:
            acts.append(action)
            if action.kind == "I":
                owed.append(W(action.stage, action.microbatch))
        elif owed:                          # a hole in the block: the oldest owed W fills it
            acts.append(owed.popleft())
    return acts + list(owed)


def _v_schedule(name: str, ranks: int, microbatches: int, chunks: int,
                block_of: Callable[[int], list[tuple[int, int, int, int]]]) -> Schedule:
    if chunks != 2:
        raise ValueError(f"{name} has exactly 2 chunks per rank (the V placement: stage r and "
                         f"stage 2*ranks-1-r on rank r), got chunks={chunks!r}; leave chunks out")
    if ranks < 2:
        raise ValueError(f"{name} needs ranks >= 2 (a V folds the model over at least two "
                         f"ranks), got ranks={ranks}")
    blocks = block_of(ranks)
    actions = [_rank_actions(rank, ranks, microbatches, blocks[rank]) for rank in range(ranks)]
    return Schedule(actions, placement=v_placement(ranks), microbatches=microbatches, name=name)


@register("v-half")
def v_half(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """V-Half: about half of 1F1B's activation memory, ⌊(p+2)/2⌋ microbatches of a rank's
    layers on every rank, and about half of its bubble (the building block above)."""
    return _v_schedule("v-half", ranks, microbatches, chunks, v_half_block)


@register("v-min")
def v_min(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """V-Min: about a third of 1F1B's activation memory, ⌊(p+4)/3⌋ microbatches of a rank's
    layers on every rank, at about two thirds of its bubble (the building block above)."""
    return _v_schedule("v-min", ranks, microbatches, chunks, v_min_block)
