"""Schedules with several stages ("chunks", virtual stages) per rank, placed in a loop.

With v chunks per rank and p ranks there are p·v stages; stage s lives on rank s mod p
(`loop_placement`), so a microbatch goes round the ranks v times. Each stage is 1/v of a rank's
layers, so a stage's forward costs T_F/v and the pipeline fills v times faster.

interleaved-1f1b (Narayanan et al., SC21 §2.2.2, arXiv 2104.04473) runs *depth first*: a round
of microbatches goes through chunk 0, then the same round through chunk 1, …; after a warm-up it
alternates one forward and one backward like 1F1B. Bubble (p−1)(T_F+T_B)/v; the first rank holds
p + (p−1)/v microbatches' activations (m ≥ 2p), the last p − (p−1)/v.

looped-bfs (Lamy-Poirier, "Breadth-First Pipeline Parallelism", arXiv 2211.05953) runs *breadth
first*: every microbatch through chunk 0, then every microbatch through chunk 1, …, then all the
backwards in reverse. The same bubble as interleaved-1f1b once m ≥ p, but every rank holds all m
microbatches' activations at the turn, as in GPipe.

    interleaved-1f1b, p=2, m=4, v=2 (stages 0 1 2 3 on ranks 0 1 0 1):
    rank 0:  0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
    rank 1:  1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3
"""
from __future__ import annotations

from ..checks import positive_int
from .actions import B, F
from .base import Schedule
from .placement import loop_placement
from .registry import register


def microbatch_rounds(ranks: int, microbatches: int) -> int:
    """Microbatches per round of the depth-first order (torch's "flexible" rule).

    Megatron sends microbatches round the loop in groups of exactly p, so it needs m to be a
    multiple of p. Any group of g ≥ p microbatches works as well (the ring is full once p are in
    flight); what matters is that the groups are equal, so the warm-up is the same every round.
    We take as many rounds as fit, max(1, m // p), each of m / rounds microbatches; when m < p
    there is one round of m.
    """
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise ValueError(
            f"interleaved-1f1b needs the microbatches to split into equal rounds of at least "
            f"`ranks` each: {microbatches} microbatches on {ranks} ranks make {rounds} rounds of "
            f"{microbatches / rounds:g}. Every round must pass the same number through each chunk, "
            f"so that each rank's warm-up fits every round. Use a multiple of {ranks} (Megatron's "
            f"rule) or another count that splits evenly, e.g. "
            f"{microbatches - microbatches % rounds} or "
            f"{microbatches + rounds - microbatches % rounds}.")
    return microbatches // rounds


def _check_chunks(name: str, chunks) -> int:
    try:
        return positive_int("chunks", chunks)
    except ValueError as error:
        raise ValueError(f"{name}: {error} (chunks = stages per rank, v in the papers)") from None


def _depth_first(microbatches: int, chunks: int, per_round: int,
                 reverse: bool = False) -> list[tuple[int, int]]:
    """(chunk, microbatch) pairs in depth-first order: a round through each chunk in turn."""
    chunk_order = range(chunks - 1, -1, -1) if reverse else range(chunks)
    return [(chunk, mb)
            for first in range(0, microbatches, per_round)
            for chunk in chunk_order
            for mb in range(first, first + per_round)]


@register("interleaved-1f1b")
def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    chunks = _check_chunks("interleaved-1f1b", chunks)
    # With one chunk there is no loop to keep full, and any m will do (it is 1F1B).
    per_round = microbatches if chunks == 1 else microbatch_rounds(ranks, microbatches)
    forwards = _depth_first(microbatches, chunks, per_round)
    backwards = _depth_first(microbatches, chunks, per_round, reverse=True)   # last chunk first
    total = len(forwards)
    actions = []
    for rank in range(ranks):
        def stage(chunk: int) -> int:
            return chunk * ranks + rank

        if chunks == 1:      # plain 1F1B: fill the pipeline, no more
            warmup_forwards = ranks - rank - 1
        else:
            # The first backward on this rank is for the last chunk of microbatch 0, which needs
            # (v−1) rounds of forwards through the earlier chunks first; while that microbatch
            # goes on to the last rank and its gradient comes back (p−1−r hops each way), the
            # rank keeps busy with one more forward per hop (Megatron's warm-up).
            warmup_forwards = (chunks - 1) * per_round + 2 * (ranks - rank - 1)
        warmup_forwards = min(warmup_forwards, total)
        # Warm-up.
        acts = [F(stage(c), mb) for c, mb in forwards[:warmup_forwards]]
        # Steady state: one forward, one backward.
        for (fc, fmb), (bc, bmb) in zip(forwards[warmup_forwards:], backwards):
            acts += [F(stage(fc), fmb), B(stage(bc), bmb)]
        # Cool-down: the backwards still owed.
        acts += [B(stage(c), mb) for c, mb in backwards[total - warmup_forwards:]]
        actions.append(acts)
    return Schedule(actions, placement=loop_placement(ranks, chunks), microbatches=microbatches,
                    name="interleaved-1f1b")


@register("looped-bfs")
def looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    chunks = _check_chunks("looped-bfs", chunks)
    actions = []
    for rank in range(ranks):
        my_stages = [chunk * ranks + rank for chunk in range(chunks)]
        # Forward: every microbatch through this rank's first chunk, then its second, …
        acts = [F(s, mb) for s in my_stages for mb in range(microbatches)]
        # Backward: the chunks in reverse, every microbatch each time.
        acts += [B(s, mb) for s in reversed(my_stages) for mb in range(microbatches)]
        actions.append(acts)
    return Schedule(actions, placement=loop_placement(ranks, chunks), microbatches=microbatches,
                    name="looped-bfs")
