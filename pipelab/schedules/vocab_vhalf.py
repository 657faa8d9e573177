"""Vocabulary parallelism on V-Half: `v-half-vocab` (Yeung et al., MLSys 2025, its second
algorithm; the authors' code is branch `v-half-vocab` of
sail-sg/zero-bubble-pipeline-parallelism, `zbv_greedy.py` and `passes.py`).

On 1F1B (`vocab-1`, `vocab-2`) the transformer activations stay unbalanced: rank r holds
p+1−r or p+2−r microbatches. V-Half already balances them (every rank holds ⌊(p+2)/2⌋, the V's
two chunks together), and the V puts the model's first and last stage on rank 0, where both
vocabulary layers would sit without sharding. With the vocabulary passes woven in, memory and
compute are both balanced.

The authors' change to V-Half is one number: each barrier the last stage must hide widens the
gap between a rank's forwards and its input gradients by one interval (6 slots, a microbatch's
block), so every rank holds one more microbatch per barrier, the same on every rank. The passes
go in by the rule of vocab.py's `weave`, with the authors' one offset: an output-layer step is
due one backward slot after X_i exists (their `passes.add_embedding_passes` reserves it for
broadcasting X).
"""
from __future__ import annotations

from .base import Schedule
from .placement import v_placement
from .registry import register
# V-Half's block and its slot-by-slot expansion are v_shape.py's; we only widen the block.
from .v_shape import INTERVAL, block_actions, v_half_block
from .vocab import UNIT, weave


def widened_v_half_block(ranks: int, intervals: int) -> list[tuple[int, int, int, int]]:
    """V-Half's block with each input gradient `intervals` intervals later (the authors add one,
    `interval += 6`, per barrier): one more microbatch in flight on every rank per interval."""
    late = INTERVAL * intervals
    return [(f0, f1, i1 + late, i0 + late) for f0, f1, i1, i0 in v_half_block(ranks)]


def build(ranks: int, microbatches: int, barriers: int = 1, widen: int | None = None) -> Schedule:
    """`v-half-vocab`'s order with the block widened by `widen` intervals (default: one per
    barrier, the authors' choice); less hides less of the barriers' time, at a microbatch less
    memory per interval (tests/test_vocab_vhalf.py checks the trade at p = 3)."""
    widen = barriers if widen is None else widen
    # Not squeezed: the authors' v-half-vocab branch turns the reordering off (do_reorder=False)
    # and places the passes on the block's own slots. (Squeezed first, our simulator keeps every
    # peak and shortens the step at small m; we follow the authors.)
    actions = block_actions(ranks, microbatches,
                            lambda p: widened_v_half_block(p, widen), squeezed=False)
    base = Schedule(actions, v_placement(ranks), microbatches, name="v-half+wider")
    return weave(base, barriers, delay=UNIT["I"], name="v-half-vocab")


@register("v-half-vocab")
def v_half_vocab(ranks: int, microbatches: int, barriers: int = 1) -> Schedule:
    """V-Half with the vocabulary passes: `barriers=1` fuses the input gradient into the one
    barrier (as `vocab-2`), `barriers=2` has C0 and C1 (as `vocab-1`); every rank holds
    ⌊(p+2)/2⌋ + barriers microbatches of its layers."""
    if type(barriers) is not int or barriers not in (1, 2):
        raise ValueError(f"barriers must be 1 (the input gradient fused into the barrier after S, "
                         f"as vocab-2) or 2 (C0 after S and C1 after T, as vocab-1), "
                         f"got {barriers!r}")
    if ranks < 2:
        raise ValueError(f"v-half-vocab needs ranks >= 2 (a V folds the model over at least two "
                         f"ranks), got ranks={ranks}")
    return build(ranks, microbatches, barriers)
