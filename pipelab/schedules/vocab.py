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
rank 0's backward of i.
"""
from __future__ import annotations

from .actions import Action, B, F
from .base import Schedule
from .graph import execution_order, timed_run
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


def _one_f_one_b(rank: int, ranks: int, m: int, extra: int) -> list[Action]:
    """1F1B's order for one rank with `extra` more warm-up forwards."""
    warmup = min(ranks - rank - 1 + extra, m)
    acts = [F(rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        acts += [F(rank, warmup + i), B(rank, i)]
    return acts + [B(rank, i) for i in range(m - warmup, m)]


def _unit_starts(actions: list[list[Action]], m: int) -> dict[Action, tuple[float, float]]:
    """(start, end) of each action with F=1, B=2, the constants the authors place S with (timed
    along the schedule's own dataflow graph: a generator does not need the simulator)."""
    base = Schedule(actions, tuple(range(len(actions))), m, name="1f1b+warm-up")
    unit = {"F": 1.0, "B": 2.0}
    return {step: (start, end) for _, step, start, end
            in timed_run(execution_order(base), lambda a: unit[a[1]])}


def vocab_parallel(ranks: int, microbatches: int, barriers: int) -> Schedule:
    """1F1B with the vocabulary passes woven in; `barriers` is 2 (Vocab-1) or 1 (Vocab-2)."""
    p, m, last = ranks, microbatches, ranks - 1
    base = [_one_f_one_b(r, p, m, extra=barriers) for r in range(p)]
    when = _unit_starts(base, m)
    x_ready = [when[F(last, i)][1] for i in range(m)]

    # The output-layer step of microbatch i: T(i−1) S(i), then the barrier(s).
    steps = []
    for i in range(m):
        reduce = [("Ct", i - 1)] * (i > 0) + [("Cs", i)] if barriers == 2 else [("C", i)]
        steps.append([("T", i - 1)] * (i > 0) + [("S", i)] + reduce)
    # The embedding collectives ride along (every rank reaches a step at about the same time):
    # Vf(j) with the last step at least one period (F+B) before rank 0's F(j), or first of
    # all; Vb(i) with the first step after rank 0's B(i), or at the very end.
    opening, closing, ending = [], [("T", m - 1)] + [("Ct", m - 1)] * (barriers == 2), []
    lookups: dict[int, list] = {}
    for j in range(m):
        earlier = [i for i in range(m) if x_ready[i] + 3 <= when[F(0, j)][0]]
        lookups.setdefault(earlier[-1] if earlier else -1, []).append(("Vf", j))
        later = [i for i in range(m) if x_ready[i] >= when[B(0, j)][1]]
        (steps[later[0]] if later else ending).append(("Vb", j))
    opening += lookups.pop(-1, [])
    for i, items in lookups.items():
        steps[i][:0] = items
    # Vocab-1's last C1 is needed before the last B: its T goes into the cool-down, one B
    # ahead (right after S, T would wait for C0 with nothing to hide it). Vocab-2's last T
    # can wait for the end.
    tail = when[B(last, max(m - 2, 0))][0] if barriers == 2 else float("inf")
    groups = [(0.0, opening)] + list(zip(x_ready, steps)) + \
        [(max(tail, x_ready[-1]), closing), (float("inf"), ending)]

    actions = []
    for r in range(p):
        own, out, k = base[r], [], 0
        for due, items in groups:      # at rank r's first action boundary at or after `due`
            while k < len(own) and when[own[k]][0] < due:
                out.append(own[k])
                k += 1
            for kind, i in items:
                stage = r if kind in ("S", "T") else (0 if kind in ("Vf", "Vb") else last)
                out.append(Action(stage, kind, i))
        actions.append(out + own[k:])
    name = "vocab-1" if barriers == 2 else "vocab-2"
    return Schedule(actions, tuple(range(p)), m, name=name)


@register("vocab-1")
def vocab_1(ranks: int, microbatches: int) -> Schedule:
    """Two barriers (C0 after S, C1 after T): rank r holds p+2−r microbatches."""
    return vocab_parallel(ranks, microbatches, barriers=2)


@register("vocab-2")
def vocab_2(ranks: int, microbatches: int) -> Schedule:
    """One barrier (the input gradient fused into C0): rank r holds p+1−r microbatches."""
    return vocab_parallel(ranks, microbatches, barriers=1)
