"""Vocabulary parallelism on 1F1B: `vocab-1` and `vocab-2` (Yeung et al., MLSys 2025).

The input embedding and the output layer (projection + softmax cross-entropy) are cut along the
vocabulary into one shard per pipeline rank. Every rank runs its shard as small extra passes:

    S   (rank r, microbatch i)  partial logits of X_i against W_r; its max, sum of exponentials,
                                softmax, and the target's logit when the target is in the shard
    T   (rank r, microbatch i)  the gradient from the softmax: dW_r (and, Vocab-1, dX_r)
    Cs  barrier C0 after S      all-reduce MAX and SUM: the global max and sum of exponentials
    Ct  barrier C1 after T      all-reduce SUM of the dX_r: the last stage's output gradient
    C   Vocab-2's one barrier   C0 with the input gradient fused in (so T needs no C1)
    Vf  embedding forward       each rank looks up its in-shard ids, all-reduce SUM
    Vb  embedding backward      rank 0's input gradient broadcast, scatter-added per shard

The barriers and the embedding collectives run on every rank together, beside the compute (the
paper's side stream): a collective of all ranks on their communication lane. S and T are stage
r's passes on rank r. Barriers are written on the last stage (`3Cs5`: the barrier of
microbatch 5, whose X the last stage produced); the embedding collectives on stage 0.

Placement, as in the authors' code: 1F1B with one more warm-up forward per barrier the last
rank must hide (Vocab-1: two, so rank r holds p+2−r microbatches; Vocab-2: one, p+1−r). The
output-layer step of microbatch i is `T(i−1) S(i)` then its barrier(s); on every rank it goes
at the first action boundary after X_i exists, read off a unit-cost timing (F=1, B=2, the
constants the authors' scripts use); Vf(i) goes just before rank 0 needs it, Vb(i) just after
rank 0's backward of i. `weave` does this for any base order with the extra microbatches already
in flight; vocab_vhalf.py gives it V-Half's (`v-half-vocab`). The planner asks for hundreds of
sizes up to p = 72, m = 288: the timing is one walk over the base's rows (vocab_timing.py), the
passes are placed for all ranks at once in numpy, and every schedule takes its actions from
shared rows (ActionRows) instead of making its own.
"""
from __future__ import annotations

from itertools import chain, repeat

import numpy as np

from . import vocab_timing as timing
from .actions import Action
from .base import Schedule
from ..model.memory_rules import FREES_SHARD, KEEPS_SHARD
from .kinds import (ACTIVATION, COMMUNICATION, EMBEDDED, OUTPUT_GRADIENT, SHARD_PASS, Input,
                    register_kind)
from .registry import register

VOCAB_KINDS = frozenset({"S", "T", "Cs", "Ct", "C", "Vf", "Vb"})
_new = tuple.__new__


def _all_ranks(schedule, action) -> tuple[int, ...]:
    return tuple(range(schedule.ranks))


def _last(schedule) -> int:
    return len(schedule.placement) - 1


def _output_inputs(schedule, a: Action) -> list[Input]:
    """S reads X_i, the last stage's output (an activation crossing to every rank)."""
    last = _last(schedule)
    found = schedule.producer_of(ACTIVATION, last, a[2])
    return [_new(Input, ("x", found, True))]


def barrier_of(schedule, microbatch: int) -> Action:
    """The barrier after S(i): Vocab-2's fused `C` when the schedule has it, else `Cs`."""
    found = schedule.producer_of(OUTPUT_GRADIENT, _last(schedule), microbatch)
    kind = "C" if found.kind == "C" else "Cs"
    return _new(Action, (_last(schedule), kind, microbatch))


def _softmax_grad_inputs(schedule, a: Action) -> list[Input]:
    """T reads what its own S kept and the barrier's global max and sum (local state)."""
    return [_new(Input, ("partials", _new(Action, (a[0], "S", a[2])), False)),
            _new(Input, ("totals", barrier_of(schedule, a[2]), False))]


def _after_every(kind: str):
    def inputs(schedule, a: Action) -> list[Input]:
        return [_new(Input, (kind.lower(), _new(Action, (r, kind, a[2])), False))
                for r in range(schedule.ranks)]
    return inputs


def _embedding_grad_inputs(schedule, a: Action) -> list[Input]:
    return [_new(Input, ("grad", schedule.input_grad_action(0, a[2]), False))]


def _free(costs, stage: int) -> float:
    return 0.0


# Costs default to zero: give them in the table (pl.Costs(kinds={"S": ..., "T": ...})). The
# planner derives them from its calibration (planner/costs.py), chapter 08 from a measured
# profile (chapters/vocabulary_parallelism.py).
register_kind("S", "output-layer forward of this rank's vocabulary shard",
              inputs=_output_inputs, cost=_free, module="pipelab", role=SHARD_PASS,
              bytes=KEEPS_SHARD, colour="#8C564B", label="head fwd")
register_kind("T", "output-layer backward of this rank's vocabulary shard",
              inputs=_softmax_grad_inputs, cost=_free, module="pipelab", role=SHARD_PASS,
              bytes=FREES_SHARD, colour="#E377C2", label="head bwd")
register_kind("Cs", "vocabulary barrier C0: all-reduce of the max and the sum of exponentials",
              inputs=_after_every("S"), members=_all_ranks, lane="comm", cost=_free,
              module="pipelab", role=COMMUNICATION, colour="#7F7F7F", label="barrier C0")
register_kind("Ct", "vocabulary barrier C1: all-reduce of the output-layer input gradient",
              inputs=_after_every("T"), members=_all_ranks, lane="comm", cost=_free,
              output=OUTPUT_GRADIENT, module="pipelab", role=COMMUNICATION, colour="#595959",
              label="barrier C1")
register_kind("C", "vocabulary barrier: max, sum of exponentials and input gradient (fused)",
              inputs=_after_every("S"), members=_all_ranks, lane="comm", cost=_free,
              output=OUTPUT_GRADIENT, module="pipelab", role=COMMUNICATION, colour="#7F7F7F",
              label="barrier")
register_kind("Vf", "input-embedding forward: in-shard lookups, all-reduced",
              members=_all_ranks, lane="comm", cost=_free, output=EMBEDDED, module="pipelab",
              role=SHARD_PASS, colour="#17BECF", label="embed fwd")
register_kind("Vb", "input-embedding backward: the gradient broadcast, scatter-added per shard",
              inputs=_embedding_grad_inputs, members=_all_ranks, lane="comm", cost=_free,
              module="pipelab", role=SHARD_PASS, colour="#BCBD22", label="embed bwd")


class ActionRows:
    """Rows of actions shared by every schedule built here: `get(stage, kind, m)` is a list
    whose first m entries are Action(stage, kind, i), i < m. An action is an immutable value,
    and making 10^5 of them for each schedule (a tuple each) cost a quarter of the vocabulary
    generators' time. Once `limit` actions are held the rows start again from empty."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0
        self.rows: dict[tuple[int, str], list[Action]] = {}

    def get(self, stage: int, kind: str, m: int) -> list[Action]:
        row = self.rows.get((stage, kind))
        if row is None or len(row) < m:
            have = 0 if row is None else len(row)
            if self.held + m - have > self.limit:
                self.rows.clear()
                self.held, row, have = 0, None, 0
            if row is None:
                row = self.rows[(stage, kind)] = []
            row.extend(map(_new, repeat(Action), zip(repeat(stage), repeat(kind), range(have, m))))
            self.held += m - have
        return row


ROWS = ActionRows(limit=1 << 18)        # about 25 MB: the planner's space 2 needs half


def one_f_one_b_rows(ranks: int, m: int, extra: int) -> tuple[Schedule, timing.Rows]:
    """1F1B with `extra` more warm-up forwards on every rank, and its rows. Rank r runs
    w = min(p−1−r+extra, m) forwards, then F(w+j) B(j) for j < m−w, then the last w backwards:
    computed for every rank and place at once, the actions gathered from ROWS."""
    place = np.arange(2 * m)
    warmup = np.minimum(ranks - 1 - np.arange(ranks) + extra, m)[:, None]
    j = place - warmup                               # steady state: F(w + j/2), B((j−1)/2)
    steady = (place >= warmup) & (place < 2 * m - warmup)
    backward = np.where(place < warmup, 0, np.where(steady, j % 2, 1))
    mb = np.where(place < warmup, place, np.where(steady, np.where(j % 2, j // 2, warmup + j // 2),
                                                  place - m))
    # Rank r's row of F, then of B, in a pool: F(r, i) is pool[2rm + i], B(r, i) pool[2rm + m + i].
    pool = []
    for r in range(ranks):
        pool += ROWS.get(r, "F", m)[:m] + ROWS.get(r, "B", m)[:m]
    pool = np.fromiter(pool, object, 2 * ranks * m)
    picked = pool[(2 * np.arange(ranks)[:, None] + backward) * m + mb]
    base = Schedule([acts.tolist() for acts in picked], tuple(range(ranks)), m,
                    name="1f1b+warm-up")
    stage = np.repeat(np.arange(ranks), 2 * m)
    return base, timing.Rows(stage, backward.ravel() * timing.BASE_KINDS.index("B"), mb.ravel())


# The unit costs the passes are placed with: the constants of the authors' scripts (F=1, B=2),
# a split backward's halves one each (their V-shape patterns give F, B and W one slot each).
UNIT = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
SHARD_KINDS = ("S", "T")          # on each rank's first stage; the rest on one stage for all


def weave(base: Schedule, barriers: int, delay: float = 0.0, name: str = "",
          rows: timing.Rows | None = None) -> Schedule:
    """`base` (forwards and backwards only, every rank already holding one more microbatch per
    barrier) with the vocabulary passes woven in; `barriers` is 2 (C0 and C1) or 1 (fused C).

    Each pass goes on every rank at the rank's first action boundary at or after a due time,
    read off `base` on unit costs. The output-layer step of microbatch i, `T(i−1) S(i)` and its
    barrier(s), is due `delay` after X_i exists. Vf(j) goes with the last step at least one
    period (a rank's unit work per microbatch) before stage 0's forward of j, or first of all;
    Vb(i) with the first step after stage 0's input gradient of i, or at the very end. S and T
    run on each rank's first stage, the barriers are written on the last stage, the embedding
    collectives on stage 0. `rows`, if `base` was made from them: its actions as arrays."""
    p, m, last = base.ranks, base.microbatches, base.stages - 1
    when = timing.timeline(base, UNIT, (0, last), rows)
    period = sum(UNIT[a[1]] for a in base.actions[0]) / m
    # The last stage's backward of i waits for its barrier (with two, T(i)'s C1 too), hence for
    # S(i) on every rank: nothing may be due after that backward starts, or the ranks deadlock.
    grad_at = when.start[when.grad[last]]
    grad = grad_at.tolist()
    due = np.minimum(when.end[when.forward[last]] + delay, grad_at).tolist()
    steps = [[("S", i), ("Cs" if barriers == 2 else "C", i)] for i in range(m)]
    # T(i) (and its C1) is due with the next step; with two barriers no later than the last
    # stage's backward of i, and the last one a backward ahead of the last (in the cool-down;
    # right after S it would wait for C0 with nothing to hide it). With one, the last T ends
    # the step.
    if barriers == 2:
        t_due = [min(due[i + 1] if i + 1 < m else max(grad[max(m - 2, 0)], due[-1]), grad[i])
                 for i in range(m)]
    else:
        t_due = due[1:] + [float("inf")]
    groups = []
    for i in range(m):
        t_items = [("T", i)] + [("Ct", i)] * (barriers == 2)
        if i + 1 < m and t_due[i] == due[i + 1]:    # one lm-head step: T(i) S(i+1), barriers
            steps[i + 1][:0] = t_items[:1]
            steps[i + 1][2:2] = t_items[1:]
        else:
            groups.append((t_due[i], (i + 1, 0), t_items))
    # The embedding collectives ride along (every rank reaches a step at about the same time).
    lookups: dict[int, list] = {}
    ending = []
    # For every j at once (m × m comparisons in numpy, not in Python): the last step due a
    # period before stage 0's forward of j, and the first due after its input gradient.
    due_at = np.array(due)
    fwd = when.start[when.forward[0]]
    grads = when.end[when.grad[0]]
    before = (due_at + period)[None, :] <= fwd[:, None]
    after = due_at[None, :] >= grads[:, None]
    last_before = np.where(before.any(1), m - 1 - before[:, ::-1].argmax(1), -1).tolist()
    first_after = np.where(after.any(1), after.argmax(1), -1).tolist()
    for j in range(m):
        lookups.setdefault(last_before[j], []).append(("Vf", j))
        (steps[first_after[j]] if first_after[j] >= 0 else ending).append(("Vb", j))
    opening = lookups.pop(-1, [])
    for i, items in lookups.items():
        steps[i][:0] = items
    groups += [(due[i], (i, 1), steps[i]) for i in range(m)]
    groups = [(0.0, opening)] + [(d, items) for d, _, items in sorted(groups)] + \
        [(float("inf"), ending)]
    return Schedule(_place(base, when, groups), base.placement, m, name=name or base.name)


def _place(base: Schedule, when: timing.Timeline,
           groups: list[tuple[float, list[tuple[str, int]]]]) -> list[list]:
    """Each rank's actions with every group's passes at the rank's first action boundary at
    or after the group's time, the groups in order (their times never decrease).

    A rank's actions start one after another (every unit cost is positive), so the passes
    before its action j are those of the groups due at or before j's start: one binary search
    for every action of every rank at once. The lists are then one gather from a pool: the
    base's actions and a row of ROWS for each pass's stage and kind (S and T on each rank's
    first stage, the barriers on the last, the embedding collectives on stage 0)."""
    p, m, last = base.ranks, base.microbatches, base.stages - 1
    items = [item for _, group in groups for item in group]
    n, k = when.bounds[-1], len(items)
    items_before = np.cumsum([0] + [len(group) for _, group in groups])
    due = np.searchsorted(np.array([at for at, _ in groups]), when.start, side="right")
    rank = np.repeat(np.arange(p), np.diff(when.bounds))
    # Rank r's list starts after the r lists before it: their actions and k passes each.
    own = np.arange(n) + rank * k + items_before[due]
    firsts: list = [None] * p
    for stage in range(len(base.placement) - 1, -1, -1):
        firsts[base.placement[stage]] = stage
    if None in firsts:
        raise ValueError(f"base: every rank needs a stage for its S and T, got placement "
                         f"{base.placement} on {p} ranks")
    kinds = sorted({kind for kind, _ in items})
    shared = [kind for kind in kinds if kind not in SHARD_KINDS]
    rows = [(0 if kind in ("Vf", "Vb") else last, kind) for kind in shared] + \
        [(stage, kind) for stage in firsts for kind in SHARD_KINDS]
    # Pool: the base's n actions, then m of each row: the shared kinds', then each rank's S, T.
    pool = list(chain.from_iterable(base.actions))
    for stage, kind in rows:
        pool += ROWS.get(stage, kind, m)[:m]
    pool = np.fromiter(pool, object, n + len(rows) * m)
    # The row of each pass on each rank: a shared kind's own, or rank r's row of S or T.
    code = {kind: c for c, kind in enumerate(shared)}
    code.update({kind: c for c, kind in enumerate(SHARD_KINDS)})
    on_rank = np.array([kind in SHARD_KINDS for kind, _ in items])
    pick = n + m * (np.array([code[kind] for kind, _ in items]) + len(shared) * on_rank) + \
        np.array([i for _, i in items])                  # rank 0's; rank r's S, T rows later
    pick = np.where(on_rank, pick + (m * len(SHARD_KINDS) * np.arange(p))[:, None], pick)
    out = np.empty(n + p * k, object)
    theirs = np.ones(n + p * k, bool)
    theirs[own] = False
    out[own] = pool[:n]
    out[theirs] = pool[pick.ravel()]
    ends = (np.array(when.bounds) + k * np.arange(p + 1)).tolist()
    return [out[a:b].tolist() for a, b in zip(ends, ends[1:])]


def vocab_parallel(ranks: int, microbatches: int, barriers: int) -> Schedule:
    """1F1B with the vocabulary passes woven in; `barriers` is 2 (Vocab-1) or 1 (Vocab-2)."""
    base, rows = one_f_one_b_rows(ranks, microbatches, extra=barriers)
    return weave(base, barriers, name="vocab-1" if barriers == 2 else "vocab-2", rows=rows)


@register("vocab-1")
def vocab_1(ranks: int, microbatches: int) -> Schedule:
    """Two barriers (C0 after S, C1 after T): rank r holds p+2−r microbatches."""
    return vocab_parallel(ranks, microbatches, barriers=2)


@register("vocab-2")
def vocab_2(ranks: int, microbatches: int) -> Schedule:
    """One barrier (the input gradient fused into C0): rank r holds p+1−r microbatches."""
    return vocab_parallel(ranks, microbatches, barriers=1)
