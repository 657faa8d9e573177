"""1F1B, or PipeDream-Flush (Narayanan et al. SC21 §2.2.1, arXiv 2104.04473).

Warm up with just enough forwards to fill the pipeline, then alternate one forward and one
backward, then drain the remaining backwards. Rank i never holds more than min(p−i, m)
microbatches' activations; the bubble is the same as GPipe's.
"""
from __future__ import annotations

from .actions import B, F
from .registry import register
from .base import Schedule


@register("1f1b")
def one_f_one_b(ranks: int, microbatches: int) -> Schedule:
    actions = []
    for stage in range(ranks):
        warmup_forwards = min(ranks - stage - 1, microbatches)
        steady_pairs = microbatches - warmup_forwards
        # Warm-up: fill the pipeline.
        acts = [F(stage, mb) for mb in range(warmup_forwards)]
        # Steady state: one forward, one backward.
        for i in range(steady_pairs):
            acts += [F(stage, warmup_forwards + i), B(stage, i)]
        # Cool-down: the backwards still owed.
        acts += [B(stage, mb) for mb in range(steady_pairs, microbatches)]
        actions.append(acts)
    return Schedule(actions, placement=tuple(range(ranks)), microbatches=microbatches, name="1f1b")
