"""Stage → rank placements: which rank owns each stage when ranks hold several stages."""
from __future__ import annotations


def loop_placement(ranks: int, chunks: int = 1) -> tuple[int, ...]:
    """Megatron's interleaving: stage s lives on rank s mod p (0 1 2 3 0 1 2 3 …)."""
    return tuple(s % ranks for s in range(ranks * chunks))


def v_placement(ranks: int) -> tuple[int, ...]:
    """The V shape of ZB-V and DualPipeV: down the ranks and back (0 1 2 3 3 2 1 0)."""
    return tuple(range(ranks)) + tuple(reversed(range(ranks)))
