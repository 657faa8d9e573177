"""GPipe (Huang et al. 2019, arXiv 1811.06965): every forward, then every backward.

    rank 0:  F0 F1 F2 F3 .  .  .  B0 B1 B2 B3
    rank 1:  .  F0 F1 F2 F3 .  B0 B1 B2 B3
    ...
Each rank holds all m microbatches' activations at the turn; the bubble is (p−1)(T_F + T_B).
With microbatches=1 this is naive model parallelism: one rank busy at a time.
"""
from __future__ import annotations

from .actions import B, F
from .registry import register
from .base import Schedule


@register("gpipe")
def gpipe(ranks: int, microbatches: int) -> Schedule:
    actions = []
    for stage in range(ranks):
        forwards = [F(stage, mb) for mb in range(microbatches)]
        backwards = [B(stage, mb) for mb in range(microbatches)]
        actions.append(forwards + backwards)
    return Schedule(actions, placement=tuple(range(ranks)), microbatches=microbatches, name="gpipe")
