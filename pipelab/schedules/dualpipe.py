"""DualPipe and DualPipeV (DeepSeek-V3 report, arXiv 2412.19437; github deepseek-ai/DualPipe).

Every rank holds two chunks and works on both at once: in the steady state each step is an
*overlapped pair*, the forward of one microbatch on one chunk with the full backward of another
on the other chunk (`3F5+4B0`). On a GPU the pair's compute hides the other's communication;
on our CPUs its halves run one after the other. The tail uses the zero-bubble split (I now, W
later) to fill the cool-down.

dualpipe     p ranks (p even), microbatches fed from both ends: half go down the ranks (route
             0: stage r on rank r), half come up (route 1: stage p+k, computing part k, on rank
             p−1−k). Rank r holds parts r and p−1−r: two copies of the weights in all, summed
             by `G` at the end of the step. Bubble (p/2−1)(F&B + B − 3W); p+1 activations.
dualpipe-v   DualPipe "cut in half" (Sea AI Lab): 2p stages in a V on p ranks, every microbatch
             goes down and back up, one copy of the weights. Same phases, each rank playing
             the rank of a DualPipe twice its size; bubble (p−1)(F&B + B − 3W).

One rank's steps, for P "half ranks" (p/2 for DualPipe, p for DualPipeV), its position h
(distance from the nearer end) and n microbatches per chunk; chunk 0 is the one a fresh
microbatch reaches first from this rank's end, chunk 1 the other:

    1  warm-up           2(P−h−1) × F0
    2  both directions   h+1 × (F0, F1)
    3  first backwards   P−h−1 × (I1, W, F1)
    4  main              n−2P+h+1 × (F0+B1, F1+B0)     (pairs; the turning rank's first unpaired)
    5  drain chunk 0     P−h−1 × (B1, F1+B0)
    6  backwards         h+1 × (B1, B0), the second half split into I with W owed
    7  fill with W       P−h−1 × (W, I0)
    8  owed W's          h+1 × W
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

from .actions import Action, Compound
from .base import Schedule
from .placement import v_placement
from .registry import register
from .two_way import two_way


class _Rank:
    """One rank's list, written with four primitives on its two chunks (0 and 1)."""

    def __init__(self, stages: tuple[int, int], microbatches: tuple[Sequence[int], Sequence[int]]):
        self.stages, self.microbatches = stages, microbatches
        self.next_forward, self.next_backward = [0, 0], [0, 0]
        self.owed_w: deque[tuple[int, int]] = deque()     # (stage, microbatch), oldest first
        self.acts: list = []

    def _forward(self, chunk: int) -> Action:
        mb = self.microbatches[chunk][self.next_forward[chunk]]
        self.next_forward[chunk] += 1
        return Action(self.stages[chunk], "F", mb)

    def _backward(self, chunk: int, split: bool = False) -> Action:
        stage = self.stages[chunk]
        mb = self.microbatches[chunk][self.next_backward[chunk]]
        self.next_backward[chunk] += 1
        if split:
            self.owed_w.append((stage, mb))
        return Action(stage, "I" if split else "B", mb)

    def forward(self, chunk: int) -> None:
        self.acts.append(self._forward(chunk))

    def backward(self, chunk: int, split: bool = False) -> None:
        """A full backward, or (split) its input-gradient half with the W owed for later."""
        self.acts.append(self._backward(chunk, split))

    def weight(self) -> None:
        """The oldest W still owed."""
        stage, mb = self.owed_w.popleft()
        self.acts.append(Action(stage, "W", mb))

    def pair(self, forward_chunk: int, backward_chunk: int) -> None:
        """A forward and a full backward of two microbatches as one overlapped step."""
        self.acts.append(Compound((self._forward(forward_chunk), self._backward(backward_chunk))))


def _phases(rank: _Rank, P: int, h: int, n: int) -> list:
    """DualPipe's eight phases on one rank (module docstring)."""
    turning = h == P - 1            # where the two directions meet (DualPipeV: the last rank)
    for _ in range(2 * (P - h - 1)):                         # 1 warm-up
        rank.forward(0)
    for _ in range(h + 1):                                   # 2 both directions
        rank.forward(0)
        rank.forward(1)
    for _ in range(P - h - 1):                               # 3 first backwards
        rank.backward(1, split=True)
        rank.weight()
        rank.forward(1)
    for i in range(n - 2 * P + h + 1):                       # 4 main: overlapped pairs
        if i == 0 and turning:
            rank.forward(0)          # its F0 feeds its own F1: kept apart (as DeepSeek does)
            rank.backward(1)
        else:
            rank.pair(0, 1)
        rank.pair(1, 0)
    for _ in range(P - h - 1):                               # 5 drain chunk 0
        rank.backward(1)
        rank.pair(1, 0)
    split = False                                            # 6 backwards, then split ones
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        rank.backward(1, split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        rank.backward(0, split)
    for _ in range(P - h - 1):                               # 7 fill with W
        rank.weight()
        rank.backward(0, split=True)
    for _ in range(h + 1):                                   # 8 owed W's
        rank.weight()
    assert not rank.owed_w, "every split backward's W has been run"
    return rank.acts


def _need(name: str, ranks: int, microbatches: int, ranks_even: bool) -> None:
    if ranks_even and ranks % 2:
        raise ValueError(f"{name} needs an even number of ranks (rank r pairs with rank "
                         f"ranks-1-r, which holds the replicas of its parts), got ranks={ranks}")
    if ranks_even and microbatches % 2:
        raise ValueError(f"{name} needs an even number of microbatches (half enter from each "
                         f"end), got microbatches={microbatches}")
    if microbatches < 2 * ranks:
        raise ValueError(f"{name} needs microbatches >= 2*ranks = {2 * ranks}, got "
                         f"{microbatches}: its main phase runs microbatches{'/2' if ranks_even else ''}"
                         f" - {'ranks' if ranks_even else '2*ranks'} + 1 pairs on the first rank, "
                         f"at least one")


@register("dualpipe")
def dualpipe(ranks: int, microbatches: int) -> Schedule:
    """Two directions, two copies of the weights (module docstring)."""
    _need("dualpipe", ranks, microbatches, ranks_even=True)
    p, n = ranks, microbatches // 2
    down, up = list(range(n)), list(range(n, 2 * n))       # route 0's microbatches, route 1's
    actions = []
    for r in range(p):
        route0_stage, route1_stage = r, 2 * p - 1 - r     # stage p+k (part k) is on rank p−1−k
        if r < p // 2:        # the down direction starts at this rank's end
            rank = _Rank((route0_stage, route1_stage), (down, up))
        else:
            rank = _Rank((route1_stage, route0_stage), (up, down))
        actions.append(_phases(rank, p // 2, min(r, p - 1 - r), n))
    return two_way(actions, p, microbatches, name="dualpipe")


@register("dualpipe-v")
def dualpipe_v(ranks: int, microbatches: int) -> Schedule:
    """DualPipe cut in half: a V of 2p stages, one copy of the weights (module docstring)."""
    _need("dualpipe-v", ranks, microbatches, ranks_even=False)
    p, m = ranks, microbatches
    actions = [_phases(_Rank((r, 2 * p - 1 - r), (range(m), range(m))), p, r, m)
               for r in range(p)]
    return Schedule(actions, placement=v_placement(p), microbatches=m, name="dualpipe-v")
