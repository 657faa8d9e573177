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

The down-going forward steps two slots a rank in V-Half (one in V-Min). A rank's two chunks
together live 6p + 2g − 1 slots in V-Half (4p + 2g in V-Min), the same on every rank; at one
block per 6 slots that is about p (2p/3) chunk forwards held at once, half a rank's layers each:
the peak is ⌊(p+2)/2⌋ or ⌊(p+4)/3⌋ microbatches of a rank's layers, balanced. (`g` keeps two
blocks from claiming one slot.) Repeating the block every 6 slots for m microbatches, with each
W in the first free slot after its I, leaves holes in the warm-up and cool-down; the paper's
squeeze (v_squeeze.py) pulls those actions earlier without raising any rank's peak. Each rank's
slots, in order, are its action list; the simulator (and a live run) starts each action as soon
as its inputs arrive. Slot for slot this is the authors' generator: their bubbles at p = 2, 4, 8
and four F:I:W ratios come out exactly (tests/test_v_shape.py).

Units: the simulator counts activations in a rank's worth of layers; a chunk is half of it, so
one chunk forward adds ½ and the peaks above are whole or half microbatches. Bubble at
F = I = W: V-Half leaves about half of 1F1B's, V-Min about two thirds (the authors' README);
V-Half's steady state has no bubble when W + 2I ≥ 2F and W + 2F ≥ 2I (the paper's condition,
our I being its B), V-Min's only when F = I = W.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .actions import F, I, W, Action
from .base import Schedule
from .placement import v_placement
from .registry import register
from .v_squeeze import PASSES, Plan, put_ws_in_holes, queue_runs, slot_grid, squeeze

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


def _block_plans(ranks: int, microbatches: int, block_of: Callable) -> list[Plan]:
    """Each rank's block repeated every INTERVAL slots, one list of slots per pass."""
    return [{name: [offset + INTERVAL * mb for mb in range(microbatches)]
             for name, offset in zip(PASSES, block)} for block in block_of(ranks)]


def _rank_actions(ranks: int, plans: list[Plan]) -> list[list[Action]]:
    """Each rank's actions in slot order; each hole runs an owed W, chunk 1's first as the
    authors' generator does (in these blocks one chunk at most is owed a W at a hole, as far
    as tests/test_v_shape.py looks: the other order gives the same schedules there), and the
    W's still owed at the end follow, chunk 1's first. Chunk 1's W's queue for the holes; chunk
    0's for the holes chunk 1's leave (two queues in numpy, every rank at once; past a rank's
    last action its holes run chunk 1's W's, then chunk 0's, the order of the list after it)."""
    grid = slot_grid(plans, {"F0": 1, "F1": 1, "I1": 2, "I0": 3})
    holes = grid == 0
    up_runs = queue_runs(grid == 2, holes)
    down_runs = queue_runs(grid == 3, holes & ~up_runs)
    acts = []
    for rank, plan in enumerate(plans):
        down, up = rank, 2 * ranks - 1 - rank
        owed_up = [W(up, mb) for mb in np.argsort(plan["I1"], kind="stable").tolist()]
        owed_down = [W(down, mb) for mb in np.argsort(plan["I0"], kind="stable").tolist()]
        up_slots, down_slots = np.flatnonzero(up_runs[rank]), np.flatnonzero(down_runs[rank])
        n_up, n_down = len(up_slots), len(down_slots)
        made = ([F(down, mb) for mb in range(len(plan["F0"]))]
                + [F(up, mb) for mb in range(len(plan["F1"]))]
                + [I(up, mb) for mb in range(len(plan["I1"]))]
                + [I(down, mb) for mb in range(len(plan["I0"]))]
                + owed_up[:n_up] + owed_down[:n_down])
        slots = np.concatenate([np.asarray(plan[name], np.int64) for name in PASSES[:4]]
                               + [up_slots, down_slots])
        acts.append([made[i] for i in np.argsort(slots).tolist()]
                    + owed_up[n_up:] + owed_down[n_down:])
    return acts


def block_actions(ranks: int, microbatches: int, block_of: Callable,
                  squeezed: bool = True) -> list[list[Action]]:
    """Each rank's actions: the block repeated, W's in its holes, and (if `squeezed`) the
    paper's squeeze, twice: with the W's in place (warm-up and cool-down), then without them
    (cool-down only), the W's going back into whatever holes are left."""
    plans = _block_plans(ranks, microbatches, block_of)
    if squeezed:
        plans = squeeze(put_ws_in_holes(plans), warmup=True)
        plans = squeeze([{name: plan[name] for name in PASSES[:4]} for plan in plans],
                        warmup=False)
    return _rank_actions(ranks, plans)


def _v_schedule(name: str, ranks: int, microbatches: int, chunks: int,
                block_of: Callable[[int], list[tuple[int, int, int, int]]]) -> Schedule:
    if chunks != 2:
        raise ValueError(f"{name} has exactly 2 chunks per rank (the V placement: stage r and "
                         f"stage 2*ranks-1-r on rank r), got chunks={chunks!r}; leave chunks out")
    if ranks < 2:
        raise ValueError(f"{name} needs ranks >= 2 (a V folds the model over at least two "
                         f"ranks), got ranks={ranks}")
    return Schedule(block_actions(ranks, microbatches, block_of), placement=v_placement(ranks),
                    microbatches=microbatches, name=name)


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
