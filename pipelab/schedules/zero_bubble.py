"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241).

The backward splits into I (gradient of the stage's input, which the previous stage waits for)
and W (gradient of the weights, which nobody waits for). Sending I on at once and running W
later, in what would have been a bubble, shortens the critical path. (The paper calls our I "B".)

zb-h1   1F1B's warm-up and memory (peak p); rank i runs each W i steps late, so the W's fill the
        cool-down. Bubble (p−1)(T_F + T_I − T_W): a third of 1F1B's when F = I = W.
zb-h2   more warm-up forwards (rank i: 2(p−1−i)) fill the wait for the first I, and W's pile up
        at the tail: a parallelogram. Bubble (p−1)(T_F + T_I − 2T_W) per rank's span, 0 when
        F = I = W; each rank holds up to 2p−1 microbatches. Needs m ≥ 2p−1.
zb-v    two chunks per rank in a V (stage r and 2p−1−r on rank r): the last stage is on rank 0,
        so the turn costs no trip back. Zero bubble per rank's span when F = I = W, at 1F1B's
        peak memory p on every rank. Needs m ≥ 2p−1.

All three assume our simulator's memory model: F takes one unit (1/chunks for chunk stages),
a full B frees it; with a split backward, I frees `i_frees` of it and W the rest. The peaks
above are for i_frees=0 (W frees everything), the conservative reading.
"""
from __future__ import annotations

from collections import deque

from .actions import F, I, W
from .base import Schedule
from .placement import v_placement
from .registry import register


def _need_microbatches(name: str, ranks: int, microbatches: int, why: str) -> None:
    least = 2 * ranks - 1
    if microbatches < least:
        raise ValueError(f"{name} needs microbatches >= 2*ranks - 1 = {least} with {ranks} ranks, "
                         f"got {microbatches}: {why}")


@register("zb-h1")
def zb_h1(ranks: int, microbatches: int) -> Schedule:
    actions = []
    for rank in range(ranks):
        warmup_forwards = min(ranks - rank - 1, microbatches)
        w_delay = rank          # W's held back, to fill the cool-down where I's arrive slowly
        acts = [F(rank, mb) for mb in range(warmup_forwards)]       # warm-up, as 1F1B
        pending_w: deque[int] = deque()
        # Steady state: one forward, its partner's input gradient, and a W that is `w_delay` late.
        for k in range(microbatches - warmup_forwards):
            acts += [F(rank, warmup_forwards + k), I(rank, k)]
            pending_w.append(k)
            if len(pending_w) > w_delay:
                acts.append(W(rank, pending_w.popleft()))
        # Cool-down: each I that trickles back is followed by one W; the rest close the step.
        for k in range(microbatches - warmup_forwards, microbatches):
            acts.append(I(rank, k))
            pending_w.append(k)
            acts.append(W(rank, pending_w.popleft()))
        acts += [W(rank, mb) for mb in pending_w]
        actions.append(acts)
    return Schedule(actions, placement=tuple(range(ranks)), microbatches=microbatches, name="zb-h1")


@register("zb-h2")
def zb_h2(ranks: int, microbatches: int) -> Schedule:
    """Every rank's I's follow one rhythm, shifted one step per rank (the parallelogram):

        warm-up      2(p−1−i) forwards
        phase 1      2p−1 times:       [slot] I
        phase 2      m−(2p−1) times:   [slot] [slot] I
        tail         2i+1 slots
    A slot runs the next forward while the rank holds fewer than 2p−1 microbatches, else the
    oldest W still owed. The last rank's I's come every two steps while it fills up, then every
    three; rank i runs each I one step after rank i+1, which is exactly when it arrives.
    """
    _need_microbatches("zb-h2", ranks, microbatches,
                       "the first rank runs 2p-1 forwards before its first input gradient comes "
                       "back, and the parallelogram's phases need that many microbatches")
    limit = 2 * ranks - 1                  # activations a rank may hold (the paper's 2p−1)
    actions = []
    for rank in range(ranks):
        warmup_forwards = 2 * (ranks - 1 - rank)
        rhythm = (["slot", "I"] * limit + ["slot", "slot", "I"] * (microbatches - limit)
                  + ["slot"] * (2 * rank + 1))
        acts = [F(rank, mb) for mb in range(warmup_forwards)]
        forwards, grads, weights = warmup_forwards, 0, 0
        for step in rhythm:
            if step == "I":
                acts.append(I(rank, grads))
                grads += 1
            elif forwards < microbatches and forwards - weights < limit:
                acts.append(F(rank, forwards))
                forwards += 1
            else:
                acts.append(W(rank, weights))      # always owed: the rhythm has room for no more
                weights += 1
        actions.append(acts)
    return Schedule(actions, placement=tuple(range(ranks)), microbatches=microbatches, name="zb-h2")


@register("zb-v")
def zb_v(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """Rank r holds stage r (chunk 0, on the way down) and stage 2p−1−r (chunk 1, on the way up)."""
    if chunks != 2:
        raise ValueError(f"zb-v has exactly 2 chunks per rank (the V placement: stage r and stage "
                         f"2*ranks-1-r on rank r), got chunks={chunks!r}; leave chunks out")
    _need_microbatches("zb-v", ranks, microbatches,
                       "the first rank's warm-up runs 2p-1 forwards through chunk 0 before the "
                       "first microbatch comes back up the V")
    p, m = ranks, microbatches
    actions = []
    for rank in range(p):
        down, up = rank, 2 * p - 1 - rank          # this rank's two stages
        nxt = {"F0": 0, "F1": 0, "I0": 0, "I1": 0}  # next microbatch of each pass
        owed_w: dict[int, deque] = {down: deque(), up: deque()}
        acts = []

        def run(kind: str, chunk: int, with_w: bool = False) -> None:
            stage = (down, up)[chunk]
            key = f"{kind}{chunk}"
            mb = nxt[key]
            nxt[key] += 1
            if kind == "F":
                acts.append(F(stage, mb))
                return
            acts.append(I(stage, mb))
            owed_w[stage].append(mb)
            if with_w:
                acts.append(W(stage, owed_w[stage].popleft()))

        # Warm-up 1: fill the way down; the first rank sends 2p−1 microbatches before any returns.
        for _ in range(2 * (p - rank) - 1):
            run("F", 0)
        # Warm-up 2: microbatches start coming back up: alternate up and down forwards.
        for _ in range(rank):
            run("F", 1)
            run("F", 0)
        # Warm-up 3: the first backwards at the bottom of the V, each with its W.
        for _ in range(p - rank):
            run("F", 1)
            run("I", 1, with_w=True)
        # Steady state: a forward and a full backward (I then W) on each chunk.
        while nxt["F0"] < m or nxt["F1"] < nxt["F0"]:
            if nxt["F0"] < m:
                run("F", 0)
            run("I", 0, with_w=True)
            run("F", 1)
            run("I", 1, with_w=True)
        # Cool-down: the input gradients first (someone waits for them), the W's in the gaps
        # and at the end.
        for _ in range(rank):
            run("I", 0)
            run("I", 1)
        for _ in range(p - rank):
            run("I", 0, with_w=True)
        acts += [W(up, mb) for mb in owed_w[up]] + [W(down, mb) for mb in owed_w[down]]
        actions.append(acts)
    return Schedule(actions, placement=v_placement(p), microbatches=m, name="zb-v")
