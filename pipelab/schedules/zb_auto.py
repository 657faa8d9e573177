"""zb-auto: a zero-bubble schedule built from measured costs under a memory limit (Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241, §3 — the authors' heuristic,
rewritten here in our own words from the paper and the authors' code).

ZB-H1 and ZB-H2 are drawn for F = I = W. With a measured table (F, I, W per stage, message
latency `comm`) and a per-rank memory limit, a greedy list scheduler does better: it places
operations stage by stage, each as early as its rank and its input allow, and tries to fill
every wait with weight-gradient passes (W), which nobody waits for.

    warm-up      F0 everywhere; then on each stage as many extra forwards as fit in memory and
                 in the wait for the first input gradient (fewer on each later stage); then I0
                 from the last stage back to the first
    round i ≥ 1  every stage that still has forwards runs one (stage j only if stage j+1 does),
                 each preceded by the W's it needs for memory and the W's that fit in its wait;
                 then I_i from the last stage back, W's filling the wait for the gradient
    tail         the W's still owed, in microbatch order

Three yes/no choices steer the greedy (a bubble before the first I; letting a stage skip a
forward so its I is not late; filling a partial gap with a W that overruns it). The paper
describes two such choices; the authors' code (sail-sg/zero-bubble-pipeline-parallelism) has
these three, and this follows the code. All eight combinations are tried and the schedule
with the shortest longest per-rank span wins (the paper's objective: end of a rank's last W −
start of its first F), ties going to the shorter wall-clock step.

Memory, in `peak_activations()`'s units (one microbatch's activations of one stage): F adds 1,
I frees `i_frees` of it, W the rest; only forwards are held back to respect `memory_limit`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from itertools import product

from .actions import Action
from .base import Schedule
from .kinds import unit_effects
from .registry import register

FLAGS = ("bubble_before_first_i", "skip_forward_for_i", "fill_partial_gaps")


@dataclass
class _Greedy:
    """One pass of the list scheduler: per stage, the order so far and when each op finishes."""
    ranks: int
    microbatches: int
    cost: dict                          # (kind, stage) -> time of one op
    comm: float
    limit: float
    i_frees: float
    flags: dict
    order: list = field(default_factory=list)
    done: dict = field(default_factory=dict)      # (kind, stage, microbatch) -> finish time
    free_at: list = field(default_factory=list)   # when each stage's last op finishes
    bubble: list = field(default_factory=list)    # idle time after each stage's first F
    held: list = field(default_factory=list)      # activations each stage holds now
    count: dict = field(default_factory=dict)     # kind -> ops placed on each stage
    effect: dict = field(default_factory=dict)    # kind -> activations it adds (−: frees)

    def __post_init__(self) -> None:
        p = self.ranks
        self.order = [[] for _ in range(p)]
        self.free_at, self.bubble, self.held = [0.0] * p, [0.0] * p, [0.0] * p
        self.count = {kind: [0] * p for kind in "FIW"}
        self.effect = unit_effects(self.i_frees)     # the kinds' byte rules, I's share i_frees

    # --- the one primitive -------------------------------------------------------------------
    def ready(self, kind: str, stage: int) -> float:
        """When the next `kind` op of `stage` could start: after its rank's last op and its
        input from the neighbour (F from the stage before, I from the stage after) + comm."""
        mb = self.count[kind][stage]
        start = self.free_at[stage]
        if kind == "F" and stage > 0:
            start = max(start, self.done[("F", stage - 1, mb)] + self.comm)
        if kind == "I" and stage < self.ranks - 1:
            start = max(start, self.done[("I", stage + 1, mb)] + self.comm)
        return start

    def put(self, kind: str, stage: int) -> None:
        mb = self.count[kind][stage]
        start = self.ready(kind, stage)
        if self.count["F"][stage]:          # idle before a rank's first F is not its bubble
            self.bubble[stage] += start - self.free_at[stage]
        self.free_at[stage] = self.done[(kind, stage, mb)] = start + self.cost[(kind, stage)]
        self.held[stage] += self.effect[kind]
        self.order[stage].append(Action(stage, kind, mb))
        self.count[kind][stage] += 1

    # --- W's: the filler ---------------------------------------------------------------------
    def owes_w(self, stage: int) -> bool:
        return self.count["W"][stage] < self.count["I"][stage]

    def fits(self, held: float) -> bool:
        """Whether one more forward fits next to `held` activations (float-safe: i_frees may
        leave 0.30000000000000004 behind)."""
        return held + 1.0 <= self.limit + 1e-9

    def fill_wait(self, stage: int, arrival: float) -> None:
        """Run owed W's while the stage waits for an input that arrives at `arrival`: whole
        W's that end by then, and one more over a partial gap if that gap would make this stage
        the worst (or always, with `fill_partial_gaps`)."""
        while self.owes_w(stage) and \
                self.free_at[stage] + self.cost[("W", stage)] <= arrival:
            self.put("W", stage)
        gap = arrival - self.free_at[stage]
        if self.owes_w(stage) and gap > 0:
            worst = gap > max(self.bubble) - self.bubble[stage]
            if worst or self.flags["fill_partial_gaps"]:
                self.put("W", stage)

    def forward(self, stage: int) -> None:
        while not self.fits(self.held[stage]):    # make room: W's free what their I left behind
            if not self.owes_w(stage):
                raise ValueError(f"memory_limit={self.limit:g} is too small: stage {stage} "
                                 f"cannot hold one more microbatch's activations")
            self.put("W", stage)
        if stage > 0:
            mb = self.count["F"][stage]
            self.fill_wait(stage, self.done[("F", stage - 1, mb)] + self.comm)
        self.put("F", stage)

    def input_grad(self, stage: int) -> None:
        if stage < self.ranks - 1:
            mb = self.count["I"][stage]
            self.fill_wait(stage, self.done[("I", stage + 1, mb)] + self.comm)
        if stage == 0 and self.count["F"][0] == self.microbatches:
            while self.owes_w(0):             # nothing waits for stage 0's I: pay W's first
                self.put("W", 0)
        self.put("I", stage)

    # --- the three phases --------------------------------------------------------------------
    def warmup(self) -> None:
        p, m = self.ranks, self.microbatches
        for stage in range(p):
            self.put("F", stage)
        extra = [0] * p
        # Estimate, from the last stage back, when I0's gradient reaches each stage, and count
        # the forwards that fit (in memory, and in that wait) before it.
        arrival = self.done[("F", p - 1, 0)] + self.cost[("I", p - 1)]
        for stage in range(p - 2, -1, -1):
            held, busy_until = self.held[stage], self.free_at[stage]
            while self.count["F"][stage] + extra[stage] < m and self.fits(held):
                f = self.cost[("F", stage)]
                late = busy_until + f > arrival + self.comm \
                    if self.flags["bubble_before_first_i"] else busy_until >= arrival + self.comm
                if late:
                    break
                held, busy_until, extra[stage] = held + 1.0, busy_until + f, extra[stage] + 1
            arrival = max(busy_until, arrival + self.comm) + self.cost[("I", stage)]
        # Each stage runs fewer than the one before (it starts later) — unless its warm-up
        # would already hold all its forwards (the authors' rule, kept for their results).
        for stage in range(1, p):
            while extra[stage] > 0 and extra[stage] >= extra[stage - 1] \
                    and self.count["F"][stage] + extra[stage] < m:
                extra[stage] -= 1
        for stage in range(p):
            for _ in range(extra[stage]):
                self.put("F", stage)
        for stage in range(p - 1, -1, -1):
            self.input_grad(stage)

    def wants_forward(self, stage: int) -> bool:
        """Whether `stage` runs a forward this round (before the chain rule of `steady`)."""
        forwards = self.count["F"]
        if forwards[stage] >= self.microbatches:
            return False
        nxt = stage + 1
        if not self.flags["skip_forward_for_i"] or nxt == self.ranks \
                or forwards[stage] < forwards[nxt] + 2:
            return True
        # Far enough ahead of the next stage to skip: do, if its gradient is already due, or
        # if the forward (and the W's it needs for room) would overrun that gradient and
        # waiting would not make this stage the worst.
        due = self.free_at[nxt] + self.cost[("F", nxt)] + self.cost[("I", nxt)] + self.comm
        if self.free_at[stage] >= due:
            return False
        held, owed, room_ws = self.held[stage], self.count["I"][stage] - self.count["W"][stage], 0
        while not self.fits(held) and room_ws < owed:     # the W's it must run first for room
            held += self.effect["W"]
            room_ws += 1
        if self.free_at[stage] + room_ws * self.cost[("W", stage)] + self.cost[("F", stage)] <= due:
            return True
        return due - self.free_at[stage] > max(self.bubble) - self.bubble[stage]

    def steady(self) -> None:
        p = self.ranks
        for _round in range(1, self.microbatches):
            want = [self.wants_forward(s) for s in range(p)]
            for stage in range(p - 2, -1, -1):    # a stage stays ahead of the next one
                want[stage] = want[stage] and want[stage + 1]
            for stage in range(p):
                if want[stage]:
                    self.forward(stage)
            for stage in range(p - 1, -1, -1):
                self.input_grad(stage)

    def tail(self) -> None:
        for stage in range(self.ranks):
            while self.owes_w(stage):
                self.put("W", stage)

    def run(self) -> "_Greedy":
        self.warmup()
        self.steady()
        self.tail()
        return self

    def score(self) -> tuple[float, float]:
        """(longest per-rank span, wall-clock step): what the simulator would report for this
        order, since each op was placed exactly as early as the simulator would start it."""
        first_start = [self.done[("F", s, 0)] - self.cost[("F", s)] for s in range(self.ranks)]
        span = max(end - start for end, start in zip(self.free_at, first_start))
        return round(span, 9), round(max(self.free_at), 9)


def _memory_limit(memory_limit, ranks: int) -> float:
    if memory_limit is None:
        return float(ranks)                   # ZB-H1's (and 1F1B's) peak
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, numbers.Real) \
            or not math.isfinite(memory_limit) or memory_limit < 1:
        raise ValueError(f"memory_limit must be a finite number >= 1 (microbatch-stages of "
                         f"activations a rank may hold; 1 is one microbatch), got {memory_limit!r}")
    return float(memory_limit)


def _cost_table(costs, ranks: int, microbatches: int) -> tuple[dict, float]:
    """{(kind, stage): time} for F, I and W, and the message latency, from a `pl.Costs` (read
    through its interface: a generator does not import the simulator); None: all ones."""
    if costs is None:
        return {(k, s): 1.0 for k in "FIW" for s in range(ranks)}, 0.0
    if not all(hasattr(costs, name) for name in ("of", "per", "comm", "F", "I", "W")):
        raise ValueError(f"costs must be a pl.Costs (e.g. pl.Costs(F=1, I=1, W=1)), "
                         f"got {type(costs).__name__}")
    for kind in "FIW":
        value = getattr(costs, kind)
        if isinstance(value, list) and len(value) != ranks:
            raise ValueError(f"costs.{kind} has {len(value)} per-stage values; zb-auto needs one "
                             f"number, or one per stage ({ranks})")
    share = 1.0 / microbatches if costs.per == "batch" else 1.0    # as simulate() charges it
    return {(k, s): costs.of(k, s) * share for k in "FIW" for s in range(ranks)}, costs.comm


@register("zb-auto")
def zb_auto(ranks: int, microbatches: int, costs=None,
            memory_limit: float | None = None, i_frees: float = 0.0) -> Schedule:
    """The best of the greedy's eight variants for these costs (default F = I = W = 1, no
    comm) and this memory limit (default `ranks`, ZB-H1's peak), with I freeing `i_frees` of a
    forward's activations (0: W frees them all, the simulator's default)."""
    if isinstance(i_frees, bool) or not isinstance(i_frees, numbers.Real) \
            or not 0.0 <= i_frees <= 1.0:
        raise ValueError(f"i_frees must be a number between 0 and 1 (the share of a forward's "
                         f"activations an I frees), got {i_frees!r}")
    limit = _memory_limit(memory_limit, ranks)
    table, comm = _cost_table(costs, ranks, microbatches)
    runs = [_Greedy(ranks, microbatches, table, comm, limit, i_frees,
                    dict(zip(FLAGS, choice))).run()
            for choice in product((True, False), repeat=len(FLAGS))]
    best = min(runs, key=_Greedy.score)       # the first of the best, as the authors keep it
    return Schedule(best.order, placement=tuple(range(ranks)), microbatches=microbatches,
                    name="zb-auto")
