"""A plain schedule as arrays, one row per action: its checks, edges and execution order in
numpy, for schedules of 10^5 actions (a Python step per action costs microseconds each).

"Plain" means: every step is a single action of a per-microbatch kind that no collective runs,
in range, on the rank that owns its stage, each action once, and no more (stage, microbatch)
pairs than actions (else some pair has none: something is missing). Anything else, and any
schedule these arrays cannot order (a missing producer, a deadlock), goes the step-by-step way
(validate.py, graph.py), which explains what is wrong. Both ways give the same results.

Edges come from each kind's `bulk_inputs` (kinds.py): the same rule as its `inputs`, over
arrays of stages and microbatches; a kind without one sends its schedules the step-by-step way.
"""
from __future__ import annotations

from itertools import chain, repeat
from operator import itemgetter

import numpy as np

from .actions import Action
from .kinds import DEFAULT_PRODUCER, KIND_SPECS

NONE = -1          # "no edge" in the key and position arrays
MISSING = -2       # in a key array: an edge from an action of a kind the schedule never runs


class Plain:
    """The actions of a plain schedule, rank by rank in program order: `flat[i]` is action i,
    on rank `rank[i]`, of stage `stage[i]`, kind `names[kind[i]]`, microbatch `mb[i]`; rank r's
    actions are `starts[r]:starts[r + 1]`. An action's key numbers (stage, kind, microbatch)
    over the kinds the schedule uses (`used`: kind -> its number among them); `key[i]` is row
    i's and `where[key]` the row of a key, NONE if the schedule does not run that action."""
    __slots__ = ("flat", "rank", "stage", "kind", "mb", "starts", "names", "used", "key",
                 "where")

    def __init__(self, flat, rank, stage, kind, mb, starts, names, used, key, where):
        self.flat, self.rank, self.stage, self.kind, self.mb = flat, rank, stage, kind, mb
        self.starts, self.names, self.used, self.key, self.where = starts, names, used, key, where


def plain_arrays(s) -> Plain | None:
    """The schedule as a `Plain`, or None when it is not plain (see the module's docstring)."""
    flat = list(chain.from_iterable(s.actions))
    if not flat or set(map(type, flat)) != {Action}:
        return None
    names = tuple(KIND_SPECS)
    code = {k: i for i, k in enumerate(names)
            if KIND_SPECS[k].per_microbatch and not KIND_SPECS[k].collective}
    n, m, stages = len(flat), s.microbatches, s.stages
    if stages * m > n:
        return None                       # some (stage, microbatch) has no action at all
    kind = np.fromiter(map(code.get, map(itemgetter(1), flat), repeat(NONE)), np.int64, n)
    stage = np.fromiter(map(itemgetter(0), flat), np.int64, n)
    mb = np.fromiter(map(itemgetter(2), flat), np.int64, n)
    lengths = [len(acts) for acts in s.actions]
    rank = np.repeat(np.arange(s.ranks), lengths)
    if kind.min() < 0 or stage.min() < 0 or stage.max() >= stages or mb.min() < 0 \
            or mb.max() >= m or (np.asarray(s.placement)[stage] != rank).any():
        return None                       # unknown or collective kind, out of range, misplaced
    present = np.flatnonzero(np.bincount(kind, minlength=len(names)))
    number = np.zeros(len(names), np.int64)
    number[present] = np.arange(len(present))
    key = (stage * len(present) + number[kind]) * m + mb
    where = np.full(stages * len(present) * m, NONE, np.int64)
    rows = np.arange(n)
    where[key] = rows
    if (where[key] != rows).any():
        return None                       # an action twice: one row of its key lost
    starts = np.concatenate(([0], np.cumsum(lengths)))
    used = {names[c]: i for i, c in enumerate(present.tolist())}
    return Plain(flat, rank, stage, kind, mb, starts, names, used, key, where)


class Table:
    """What a kind's `bulk_inputs` reads: action keys, the producers of outputs (the
    schedule's index, as arrays) and the stages before and after each stage on its route."""

    def __init__(self, schedule, plain: Plain):
        self.schedule, self.plain = schedule, plain
        self._made: dict[str, np.ndarray] = {}
        if schedule.routes is None:
            last = len(schedule.placement) - 1
            self._before = self._after = None
            self._last = last
        else:
            before, after = schedule.links()
            self._before, self._after = np.asarray(before), np.asarray(after)

    def of(self, kind: str, stage: np.ndarray, mb: np.ndarray) -> np.ndarray:
        """The keys of the actions (stage, kind, mb); NONE where `stage` is NONE, MISSING
        where the schedule runs no action of `kind`."""
        number = self.plain.used.get(kind)
        if number is None:
            return np.where(stage < 0, NONE, MISSING)
        key = (stage * len(self.plain.used) + number) * self.schedule.microbatches + mb
        return np.where(stage < 0, NONE, key)

    def made(self, output: str, stage: np.ndarray, mb: np.ndarray,
             default: str | None = None) -> np.ndarray:
        """The key of the action that produces `output` of (stage, mb), from the schedule's
        index of unusual producers (`Schedule.reindex`), else of the `default` kind's action
        (NONE if no default); NONE where `stage` is NONE."""
        table = self._made.get(output)
        if table is None:
            table = self._made[output] = self._producers(output)
        m = self.schedule.microbatches
        inside = stage >= 0
        found = np.where(inside, table[np.where(inside, stage, 0) * m + mb], NONE)
        if default is not None:
            found = np.where((found < 0) & inside, self.of(default, stage, mb), found)
        return found

    def before(self, stage: np.ndarray) -> np.ndarray:
        """The stage before each on its route (NONE at a route's start)."""
        return stage - 1 if self._before is None else self._before[stage]

    def after(self, stage: np.ndarray) -> np.ndarray:
        """The stage after each on its route (NONE at a route's end)."""
        if self._after is None:
            return np.where(stage == self._last, NONE, stage + 1)
        return self._after[stage]

    def _producers(self, output: str) -> np.ndarray:
        """Per (stage, mb): the key of the action of a kind that produces `output` but is not
        its usual producer (what `Schedule.reindex` indexes), else NONE."""
        from_kinds = [i for i, k in enumerate(self.plain.names) if KIND_SPECS[k].output == output
                      and DEFAULT_PRODUCER.get(output) != k]
        p, s = self.plain, self.schedule
        table = np.full(s.stages * s.microbatches, NONE, np.int64)
        rows = np.flatnonzero(np.isin(p.kind, from_kinds))
        slot = p.stage[rows] * s.microbatches + p.mb[rows]
        table[slot] = rows
        if (table[slot] != rows).any():     # two producers of one output: the index keeps the
            raise _Ambiguous                 # later one; that is left to the step-by-step way
        table[slot] = p.key[rows]
        return table


class _Ambiguous(Exception):
    """Two actions produce the same output of one (stage, microbatch)."""


def producer_rows(schedule, plain: Plain) -> np.ndarray | None:
    """(actions, edges) rows of `plain` producing each action's inputs, in its kind's input
    order (the columns past its edges: NONE); None when a kind has no `bulk_inputs`, or an
    input's producer is not in the schedule (the step-by-step pass reports that)."""
    table = Table(schedule, plain)
    columns: list[np.ndarray] = []
    try:
        for name in plain.used:
            rule = KIND_SPECS[name].bulk_inputs
            if rule is None:
                return None
            rows = np.flatnonzero(plain.kind == plain.names.index(name))
            for j, keys in enumerate(rule(schedule, table, plain.stage[rows], plain.mb[rows])):
                if j == len(columns):
                    columns.append(np.full(len(plain.flat), NONE, np.int64))
                columns[j][rows] = keys
    except _Ambiguous:
        return None
    if not columns:
        return np.full((len(plain.flat), 0), NONE, np.int64)
    keys = np.stack(columns, axis=1)
    found = np.where(keys < 0, NONE, plain.where[np.maximum(keys, 0)])
    if (keys == MISSING).any() or ((keys >= 0) & (found < 0)).any():
        return None                          # a producer the schedule never runs
    return found


def waves(plain: Plain, producers: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """An execution order in waves: in each, every rank that can run its next action does
    (its inputs made in earlier waves), in rank order. Returns (the rows in that order, where
    each wave starts in it and where the last ends), or None on a deadlock.

    An input made earlier on the same rank is there by program order and is not waited for;
    one made later on the same rank (or by the action itself) deadlocks (None: the
    step-by-step pass explains it)."""
    n, ranks = len(plain.flat), len(plain.starts) - 1
    rows = np.arange(n)
    has = producers >= 0
    local = has & (plain.rank[np.maximum(producers, 0)] == plain.rank[:, None])
    if (local & (producers >= rows[:, None])).any():
        return None
    # Slots: row i is slot i + rank(i), so each rank's actions are followed by one slot of its
    # own, its end, which never gets ready; two more slots: "always done" and "never done".
    # Each wave then looks at every rank's next slot, without keeping a list of busy ranks.
    slot = rows + plain.rank
    always, never = n + ranks, n + ranks + 1
    wait = np.where(has & ~local, slot[np.maximum(producers, 0)], always)
    wait = ascending(wait)                                       # "always" last in each row,
    wait = wait[:, (wait != always).any(axis=0)]                 # the columns that wait first
    waits = np.full((n + ranks, wait.shape[1]), never, np.int64)   # the ends wait forever
    waits[slot] = wait
    done = np.zeros(n + ranks + 2, bool)
    done[always] = True
    position = plain.starts[:-1] + np.arange(ranks)             # each rank's next slot
    one = waits[:, 0] if waits.shape[1] == 1 else None
    out, placed = [], 0
    while placed < n:
        if one is not None:
            ready = done[one[position]]
        elif waits.shape[1]:
            ready = done[waits[position]].all(axis=1)
        else:
            ready = position < (plain.starts[1:] + np.arange(ranks))
        step = position[ready]
        if not step.size:
            return None                                # no rank can move: a deadlock
        done[step] = True
        out.append(step)
        placed += step.size
        position += ready                              # the ranks that moved, one slot on
    row_of = np.empty(n + ranks, np.int64)               # slot -> row, for the rows' slots
    row_of[slot] = rows
    return row_of[np.concatenate(out)], np.cumsum([0] + [len(step) for step in out])


def ascending(rows: np.ndarray) -> np.ndarray:
    """Each row sorted (np.sort is slow on many short rows; an action has one or two inputs)."""
    if rows.shape[1] != 2:
        return np.sort(rows, axis=1)
    first, second = rows[:, 0], rows[:, 1]
    return np.stack([np.minimum(first, second), np.maximum(first, second)], axis=1)
