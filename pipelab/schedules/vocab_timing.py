"""The timeline the vocabulary weave reads: a base schedule timed on fixed costs, as arrays.

`weave` (vocab.py) places the vocabulary passes by the start of every action of the base and
the forward and input-gradient times of its first and last stage. `timed_run` along
`execution_order` gives them for any schedule, keyed by action; at the planner's sizes (p up
to 72, m up to 288) building and hashing those keys cost most of the weave. A base of F, B, I
and W on one route, which is what the generators give, is timed here in one walk over integer
rows instead: sweeping over the ranks, down and back up, each rank runs on along its order
until it needs an output another rank has not made yet. Every start is the same `max` of the
rank's last end and the inputs' ends as in `step_times`, every end the same sum, so the times
are the same floats (tests/test_vocab_timing.py compares them, on fractional costs too).
Anything else goes the general way, `timed_run`.
"""
from __future__ import annotations

from itertools import chain, repeat
from operator import itemgetter
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from .actions import Action
from .graph import execution_order, timed_run

_new = tuple.__new__
BASE_KINDS = ("F", "B", "I", "W")     # what the fast way times (every one on the compute lane)
_F, _B, _I, _W = range(len(BASE_KINDS))
_CODE = {kind: code for code, kind in enumerate(BASE_KINDS)}


class Timeline(NamedTuple):
    """Start and end of each action of a schedule, by row (rank after rank, each in program
    order; rank r's rows are `bounds[r]:bounds[r + 1]`). `forward[s][i]` is the row of F(s, i),
    `grad[s][i]` the row of the action producing stage s's input gradient of microbatch i
    (its B, or its I when the backward is split), for the stages asked for."""
    start: np.ndarray
    end: np.ndarray
    bounds: list[int]
    forward: dict[int, np.ndarray]
    grad: dict[int, np.ndarray]


def unit_times(base, costs: Mapping[str, float]) -> dict[object, tuple[float, float]]:
    """(start, end) of each step of `base` with each kind taking `costs[kind]`: the general
    way, along the schedule's own dataflow graph (no simulator needed)."""
    return {step: (start, end) for _, step, start, end
            in timed_run(execution_order(base), lambda a: costs[a[1]])}


class Rows(NamedTuple):
    """A schedule's actions by row (rank after rank, each in program order): stage, kind
    (its number in BASE_KINDS) and microbatch of each, as arrays."""
    stage: np.ndarray
    kind: np.ndarray
    mb: np.ndarray


def rows_of(base) -> Rows | None:
    """`base` as Rows; None if it runs a kind not in BASE_KINDS (or a compound step)."""
    flat = list(chain.from_iterable(base.actions))
    n = len(flat)
    kind = np.fromiter(map(_CODE.get, map(itemgetter(1), flat), repeat(-1)), np.int64, n)
    if not n or kind.min() < 0:
        return None
    return Rows(np.fromiter(map(itemgetter(0), flat), np.int64, n), kind,
                np.fromiter(map(itemgetter(2), flat), np.int64, n))


def timeline(base, costs: Mapping[str, float], stages: Sequence[int],
             rows: Rows | None = None) -> Timeline:
    """`base` timed with each kind taking `costs[kind]` (no communication time, every kind on
    the compute lane), the forward and input-gradient rows read for `stages`. `rows`, if the
    caller made `base` from them, saves reading them back off its actions."""
    found = walked(base, costs, stages, rows)
    return found if found is not None else _by_graph(base, costs, stages)


def walked(base, costs: Mapping[str, float], stages: Sequence[int],
           rows: Rows | None = None) -> Timeline | None:
    """The fast way: None unless `base` is plain F, B, I and W on one route, each action
    once, every input there, every kind costed (the general way then times it, or explains
    what is wrong)."""
    rows = rows_of(base) if rows is None else rows
    found = None if rows is None or base.routes is not None else _edges(base, rows)
    if found is None or any(k not in costs for k in BASE_KINDS):
        return None
    kind, wait, bounds, forward, grad = found
    took = np.array([float(costs[k]) for k in BASE_KINDS])[kind]
    start = _walk(wait.tolist(), took.tolist(), bounds)
    if start is None:
        return None
    start = np.fromiter(start, float, len(start))
    return Timeline(start, start + took, bounds, {s: forward[s] for s in stages},
                    {s: grad[s] for s in stages})


def _edges(base, rows: Rows):
    """(kind, wait, bounds, forward, grad) of a plain F/B/I/W schedule on one route, by row:
    its kind's number in BASE_KINDS; the row of its input made on another rank (n, the
    number of rows, if none); where each rank's rows start (and the last ends); the rows of
    F(s, i) and of the producer of s's input gradient of i, as forward[s][i] and grad[s][i].
    None for anything else: B and I both, an action out of range or twice, an input missing
    or made later on its own rank, its own stage's input made on another rank.

    The rules are kinds.py's (bulk.py's over arrays) for these four kinds on one route: F
    reads the stage before's F; B and I their own F and the stage after's input gradient (its
    I when split, else its B); W its own I. Here without the index and the tables that those
    build for any kind: the weave times bases of 10^5 actions, at every size the planner asks."""
    stage, kind, mb = rows
    n, m, stages = len(kind), base.microbatches, base.stages
    lengths = [len(acts) for acts in base.actions]
    if n != sum(lengths) or min(stage.min(), mb.min()) < 0 or stage.max() >= stages \
            or mb.max() >= m:
        return None                        # out of range, or rows not the schedule's
    used = np.bincount(kind, minlength=len(BASE_KINDS))
    if used[_B] and used[_I]:
        return None                        # whole and split backwards in one schedule
    back = _I if used[_I] else _B          # what makes a stage's input gradient
    row = np.arange(n)
    # Row of each (kind, stage, microbatch) in a table of one block per kind, stage `stages`
    # (past the last) in each: no action. A stage's neighbour is m keys away, a kind a block.
    block = (stages + 1) * m
    key = kind * block + stage * m + mb
    where = np.full(len(BASE_KINDS) * block, -1, np.int64)
    where[key] = row
    if np.count_nonzero(where >= 0) != n:
        return None                        # an action twice
    # The input from the stage before (F) or after (B, I), none at the route's ends; and the
    # one of its own stage (B, I: its F; W: its I).
    forward_ = kind == _F
    across = where[key + np.where(forward_, -m, m)]
    across[np.where(forward_, stage == 0, (kind != back) | (stage == stages - 1))] = -2
    own = where[key - np.where(kind == _W, block, back * block)]
    own[forward_] = -2
    if ((across == -1) | (own == -1)).any():
        return None                        # an input no action makes
    bounds = np.cumsum([0] + lengths)
    first = np.repeat(bounds[:-1], lengths)       # each row's rank: first..past its rows
    past = np.repeat(bounds[1:], lengths)
    if (((own >= 0) & ((own < first) | (own >= row)))
            | ((across >= row) & (across < past))).any():
        return None                        # made later on its own rank, or own on another
    wait = np.where((across >= 0) & ((across < first) | (across >= past)), across, n)
    table = where.reshape(len(BASE_KINDS), stages + 1, m)
    return kind, wait, bounds.tolist(), table[_F], table[back]


def _walk(wait: list[int], took: list[float], bounds: list[int]) -> list[float] | None:
    """Start of each row. Sweeps over the ranks, down and back up, each rank running on along
    its order until row `wait[k]` (made on another rank; len(took): none) is not made yet;
    until every rank is through (else a deadlock: None)."""
    n, ranks = len(took), len(bounds) - 1
    start = [0.0] * n
    end: list = [None] * n + [0.0]      # None: not made yet; row n: "no input", made at 0
    position, stop, free = bounds[:-1], bounds[1:], [0.0] * ranks
    sweep = list(range(ranks)) + list(range(ranks - 1, -1, -1))
    moved = True
    while moved:
        moved = False
        for r in sweep:
            k, e, t = position[r], stop[r], free[r]
            first = k
            while k < e:
                done = end[wait[k]]
                if done is None:
                    break
                if done > t:
                    t = done
                start[k] = t
                t += took[k]
                end[k] = t
                k += 1
            if k != first:
                moved = True
                position[r], free[r] = k, t
    return start if position == stop else None


def _by_graph(base, costs: Mapping[str, float], stages: Sequence[int]) -> Timeline:
    """The general way (`unit_times`), in the same arrays."""
    when = unit_times(base, costs)
    flat = list(chain.from_iterable(base.actions))
    start = np.array([when[step][0] for step in flat], float)
    end = np.array([when[step][1] for step in flat], float)
    row = {step: k for k, step in enumerate(flat)}
    m = base.microbatches
    forward = {s: np.array([row[_new(Action, (s, "F", i))] for i in range(m)], np.int64)
               for s in stages}
    grad = {s: np.array([row[base.input_grad_action(s, i)] for i in range(m)], np.int64)
            for s in stages}
    bounds = np.cumsum([0] + [len(acts) for acts in base.actions]).tolist()
    return Timeline(start, end, bounds, forward, grad)
