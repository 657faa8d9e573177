"""Chimera (Li & Hoefler, SC21, arXiv 2107.06925): two pipelines in opposite directions.

p ranks (p even) carry two pipelines over the same p stages: the *down* pipeline has stage k on
rank k, the *up* pipeline stage k on rank p−1−k, so every rank holds one stage of each — two
copies of the weights, summed by `G` at the end of the step. Half the microbatches go down,
half go up. Where one direction's pipeline has its fill-and-drain bubble on a rank, the other
is busy there: the bubble per rank falls from 1F1B's (p−1)(F+B) to (p/2−1)(F+B), a bubble
fraction of (p−2)/(2m+p−2) in the paper's slot count (one slot = F + B).

The paper draws the schedule of one "basic unit" (m = p). We get it from the rule its figure
follows, played on the figure's slots (every step one slot): every rank, in every slot, runs
the ready step of the *oldest* microbatch of its own pipeline (its index within its
direction; a backward before a forward, down before up on a tie). Each direction's first
microbatch then flows through unobstructed and the others fill in behind. The rule only
decides each rank's order; the simulator and the runtime run that order under whatever costs
they are given.

More microbatches than ranks (the paper's §3.5) — `scaling`:

- ``"concat"``, direct concatenation: the same rule over all m microbatches, one microbatch per
  forward step. The units follow each other with no gap *when a forward costs what a backward
  costs*; with a backward twice a forward (as in a real model) a unit's forwards finish early
  and its ranks wait for the next unit's backwards: intermediate bubbles, every unit again.
  At most p microbatch-stages per rank.
- ``"doubling"`` (the default), forward doubling: each forward step runs the forwards of *two*
  microbatches of its direction (a compound `0F0+0F1`, one step of 2F), so a forward step lasts
  what a backward does when B = 2F and the slots are equal again. A doubled unit is a basic
  unit whose forward steps carry two microbatches: 2p microbatches, p/2 doubled forwards each
  way. Its order: every rank, in every slot, runs a ready step of the oldest unit — within a
  unit its forwards first, then the oldest microbatch — as long as the rank holds at most 2p
  microbatch-stages, the paper's "two times the activation memory". (Forwards first: with the
  basic unit's oldest-first rule the first backwards, two per doubled forward, cut into the
  other direction's forward wave: 8 idle slots instead of 6 at p = 8, simulated. Without the
  2p cap the next unit's forwards crowd in: 2p + 1 at p = 4.) Then the next unit's forwards
  fill the drain of the one before:
  p − 2 idle slots per rank whatever m is, none between the units (a bubble fraction of
  (p−2)/(3m/2 + p − 2) at B = 2F, a slot being one backward or one doubled forward).
  Each microbatch's backward stays its own step (two backwards per doubled forward, not one
  backward of the pair): a backward needs its own microbatch's saved activations and nothing
  else, and one B per step keeps the slots equal. Where the doubled memory does not fit, the
  paper turns to backward halving instead (not built here); recomputation, which is apart from
  the order here (`cluster.run(..., recompute="full")`, exact), is another way to pay it back.
  When m/p is odd the first unit runs plain (a basic unit: (p/2 − 1)F more idle than the
  closed form); at m = p both scalings are the basic unit.
"""
from __future__ import annotations

from itertools import accumulate

from .actions import Action, Compound
from .base import Schedule
from .registry import register
from .two_way import two_way

DOWN, UP = 0, 1
SCALINGS = ("doubling", "concat")      # §3.5: forward doubling, direct concatenation


def forward_groups(ranks: int, microbatches: int, scaling: str) -> list[int]:
    """How many microbatches each forward step of one direction carries, in feeding order:
    1 throughout for "concat"; for "doubling" 2, after a plain unit of p/2 ones when the number
    of basic units, m/p, is odd (a doubled unit takes 2p microbatches)."""
    half = microbatches // 2
    if scaling == "concat":
        return [1] * half
    plain = ranks // 2 if (microbatches // ranks) % 2 else 0
    return [1] * plain + [2] * ((half - plain) // 2)


def _priority(p: int, groups: list[int]):
    """The order among a rank's ready steps (module docstring). A step is (first microbatch's
    index in its pipeline, 1 for a forward / 0 for a backward, direction, hop, microbatches)."""
    if 2 not in groups:                        # the oldest microbatch, a backward first
        return lambda step: step[:4]
    plain = groups.count(1)                    # microbatches of the plain first unit

    def key(step):
        j, forward, d, hop, size = step
        unit = 0 if j < plain else 1 + (j - plain) // p       # doubled units: p per direction
        return (unit, -forward if size == 2 else 0, j, forward, d, hop)
    return key


def _slot_order(p: int, m: int, groups: list[int], cap: int | None) -> list[list]:
    """Each rank's steps under the rule of the module docstring, slot by slot; `groups` are the
    sizes of one direction's forward steps (forward_groups); `cap`: the most microbatch-stages
    a rank may hold before it starts a forward (None: no limit)."""
    half = m // 2

    def rank_of(direction: int, hop: int) -> int:          # hop: position along the route
        return hop if direction == DOWN else p - 1 - hop

    def stage_of(direction: int, hop: int) -> int:
        return hop if direction == DOWN else p + hop

    key = _priority(p, groups)
    # Each direction feeds its forward steps in order: only the next one waits at the route's
    # first rank (a later one never goes before it), so the ready lists stay short.
    feed = []
    for d in (DOWN, UP):
        firsts = accumulate(groups[:-1], initial=0)
        feed.append(iter([(j, 1, d, 0, size) for j, size in zip(firsts, groups)]))
    ready: list[list] = [[] for _ in range(p)]
    for d in (DOWN, UP):
        ready[rank_of(d, 0)].append(next(feed[d]))
    held = [0] * p                             # microbatch-stages whose backward is still due
    actions: list[list] = [[] for _ in range(p)]
    left = 2 * p * (len(groups) + half)        # forward steps and backwards, both directions
    while left:
        enabled = []
        ran = left
        for rank in range(p):
            runnable = [s for s in ready[rank]
                        if not s[1] or cap is None or held[rank] + s[4] <= cap]
            if not runnable:
                continue                       # a bubble slot
            step = min(runnable, key=key)
            ready[rank].remove(step)
            left -= 1
            j, forward, d, hop, size = step
            stage = stage_of(d, hop)
            if not forward:
                held[rank] -= 1
                actions[rank].append(Action(stage, "B", j + half * d))
                if hop > 0:
                    enabled.append((j, 0, d, hop - 1, 1))
                continue
            held[rank] += size
            parts = [Action(stage, "F", j + k + half * d) for k in range(size)]
            actions[rank].append(parts[0] if size == 1 else Compound(parts))
            following = next(feed[d], None) if hop == 0 else None
            if following:                      # the direction's next forward step may start
                enabled.append(following)
            if hop < p - 1:                    # on to the next stage
                enabled.append((j, 1, d, hop + 1, size))
            else:                              # the route's end: each microbatch turns back
                enabled += [(j + k, 0, d, hop, 1) for k in range(size)]
        assert left < ran, "a slot in which no rank can run anything: the order is stuck"
        for step in enabled:                   # what this slot finished is ready in the next
            ready[rank_of(step[2], step[3])].append(step)
    return actions


@register("chimera")
def chimera(ranks: int, microbatches: int, scaling: str = "doubling") -> Schedule:
    """Two 1F1B pipelines in opposite directions over the same ranks; `scaling` says how it runs
    more microbatches than ranks: "doubling" (default, forward doubling) or "concat" (direct
    concatenation of basic units). Module docstring."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(map(repr, SCALINGS))} (Chimera "
                         f"§3.5: forward doubling, direct concatenation), got {scaling!r}")
    if ranks % 2:
        raise ValueError(f"chimera needs an even number of ranks (rank r holds the down "
                         f"pipeline's stage r and the up pipeline's stage p-1-r), got "
                         f"ranks={ranks}")
    if microbatches % ranks:
        raise ValueError(f"chimera needs microbatches to be a multiple of ranks ({ranks}): its "
                         f"basic unit sends ranks/2 microbatches each way, got "
                         f"microbatches={microbatches}")
    groups = forward_groups(ranks, microbatches, scaling)
    cap = 2 * ranks if scaling == "doubling" else None     # twice the basic unit's p
    return two_way(_slot_order(ranks, microbatches, groups, cap), ranks, microbatches,
                   name="chimera")
