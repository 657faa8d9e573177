"""STP: synergistic tensor and pipeline parallelism (Qi et al. 2025, arXiv 2510.27257).

With tensor parallelism every forward and every input-gradient pass ends its attention and its
MLP with an all-reduce, and the compute waits for it: the TP bubble. STP braids two units of
*different* microbatches into one step, so one unit's all-reduce runs while the other computes:

    FF   forward of microbatch j and j+1 (same chunk)      each all-reduce under the other's compute
    FB   forward of j, backward (I + W) of an older one    F's all-reduce under B, B's under W
    FBd  the same with W deferred (to a FIFO)              B's all-reduce under the next step
    FW   a chunk-0 forward and the oldest deferred W       F's all-reduce under W

A compound action is such a step: `F+B`, `F+I`, `F+F`, `F+W`. Only the standalone forwards of
the warm-up expose their all-reduce: 2p+1 on rank 0, hence the TP bubble (2p+1)·T_AR.

Placement is the V of zb-v (rank r holds stage r, "chunk 0", and stage 2p−1−r, "chunk 1").
Rank r's order, phase by phase (read off the authors' code, STPSchedule.generate):

    1  2(p−r−1) × F0                                   fill the way down
    2  (r+1) × [F0, F1]                                microbatches turn at the bottom of the V
    3  (r+1) more F0: one alone if r+1 is odd, the rest in FF pairs
    4  (p−r−1) × [FBd1, FW0]                           first backwards, deferred W as filler
    5  2(m−3p+1)+1+2r blocks FB1, FB0, FB1, …          steady state; the last r are FBd
    6  (2p−r−2) × [B0, FBd1]
    7  (r+1) × [B0, B1]
    8  B0, then (p−r−1) × [W, W, B0]
    9  2r × W                                          the deferred W's, oldest first

The forward of chunk c with microbatch j is braided with the backward of microbatch j−r−1
(chunk 1) or j−(3p−1−r) (chunk 0). Rank 0 runs 3p−1 chunk-0 forwards before its first chunk-0
backward, so the order holds exactly m forwards and m backwards per chunk only when m ≥ 3p−1
(the authors' code asserts m ≥ 2p; for 2p ≤ m < 3p−1 its order is invalid). Here m < 3p−1 is a
ValueError.

Activation offload (the paper's memory variant, `offload=fraction`). A chunk-0 forward's
activations wait 3p−1−r steps for their backward, a chunk-1 forward's only r+1: the authors mark
every chunk-0 forward instruction for offload and no chunk-1 one (their generator passes
offload=1 with phase 0, 0 with phase 1), so that is `offload=1`. A smaller fraction offloads that
share of the chunk-0 microbatches, spread evenly (microbatch j when ⌊(j+1)·f⌋ > ⌊j·f⌋), so the
saving holds at every moment of the steady state. Each chosen forward's step is followed by an
offload `Off` of its activations; a reload `Re` is placed before the compute step that precedes
the backward (the authors' ActReload: a prefetch one instruction ahead). Both copy on the rank's
copy lane while the compute runs on.
"""
from __future__ import annotations

from collections import deque

import math
import numbers

from .actions import Action, B, Compound, F, I, W
from .base import Schedule
from .kinds import OFFLOAD, RELOAD
from .placement import v_placement
from .registry import register


@register("stp")
def stp(ranks: int, microbatches: int, chunks: int = 2, offload: float = 0.0) -> Schedule:
    if isinstance(offload, bool) or not isinstance(offload, numbers.Real) \
            or not 0.0 <= offload <= 1.0:
        raise ValueError(f"offload must be a number from 0 to 1 (the share of chunk-0 "
                         f"microbatches whose activations leave the device), got {offload!r}")
    if chunks != 2:
        raise ValueError(f"stp has exactly 2 chunks per rank (the V placement: stage r and stage "
                         f"2*ranks-1-r on rank r), got chunks={chunks!r}; leave chunks out")
    p, m = ranks, microbatches
    if m < 3 * p - 1:
        raise ValueError(f"stp needs microbatches >= 3*ranks - 1 = {3 * p - 1} with {p} ranks, "
                         f"got {m}: rank 0 runs 3p-1 chunk-0 forwards before its first chunk-0 "
                         f"backward, so a smaller m leaves the braids without partners")
    chosen = [j for j in range(m) if math.floor((j + 1) * offload) > math.floor(j * offload)]
    orders = [_with_offload(_rank_order(p, m, r), r, chosen) for r in range(p)]
    return Schedule(orders, placement=v_placement(p), microbatches=m, name="stp")


def _with_offload(acts: list, stage: int, chosen: list[int]) -> list:
    """`acts` with an offload after the step of each chosen microbatch's forward on `stage`,
    and its reload before the compute step that precedes its backward."""
    if not chosen:
        return acts
    where = {(part.kind, part.microbatch): i for i, item in enumerate(acts)
             for part in item.parts if part.stage == stage}
    after: dict[int, list] = {}
    before: dict[int, list] = {}
    for mb in chosen:
        forward = where[("F", mb)]
        backward = where.get(("I", mb), where.get(("B", mb)))
        after.setdefault(forward, []).append(Action(stage, OFFLOAD, mb))
        # one step ahead of the backward, but never before the offload itself
        before.setdefault(max(backward - 1, forward + 1), []).append(Action(stage, RELOAD, mb))
    out = []
    for i, item in enumerate(acts):
        out += before.get(i, []) + [item] + after.get(i, [])
    return out


def _rank_order(p: int, m: int, r: int) -> list:
    stage = (r, 2 * p - 1 - r)             # this rank's chunk 0 and chunk 1
    forward, backward = [0, 0], [0, 0]     # the next microbatch of each chunk
    deferred: deque = deque()              # W's owed by FBd steps, run oldest first
    acts: list = []

    def next_f(c: int):
        forward[c] += 1
        return F(stage[c], forward[c] - 1)

    def next_b(c: int, defer: bool) -> list:
        backward[c] += 1
        mb = backward[c] - 1
        if defer:
            deferred.append(W(stage[c], mb))
            return [I(stage[c], mb)]
        return [B(stage[c], mb)]

    def braid(*parts) -> None:
        acts.append(Compound(parts))

    def fb(c: int, defer: bool) -> None:
        braid(next_f(c), *next_b(c, defer))

    for _ in range(2 * (p - r - 1)):                       # 1
        acts.append(next_f(0))
    for _ in range(r + 1):                                 # 2
        acts += [next_f(0), next_f(1)]
    if (r + 1) % 2:                                        # 3
        acts.append(next_f(0))
    for _ in range((r + 1) // 2):
        braid(next_f(0), next_f(0))
    for _ in range(p - r - 1):                             # 4
        fb(1, defer=True)
        braid(next_f(0), deferred.popleft())
    steady = 2 * (m - 3 * p + 1) + 1 + 2 * r               # 5
    for i in range(steady):
        fb(1 - i % 2, defer=i >= steady - r)
    for _ in range(2 * p - r - 2):                         # 6
        acts += next_b(0, defer=False)
        fb(1, defer=True)
    for _ in range(r + 1):                                 # 7
        acts += next_b(0, defer=False) + next_b(1, defer=False)
    acts += next_b(0, defer=False)                         # 8
    for _ in range(p - r - 1):
        acts += [deferred.popleft(), deferred.popleft()] + next_b(0, defer=False)
    acts += list(deferred)                                 # 9
    return acts
