"""Peak live activation bytes per rank, two ways that agree: along a simulated timeline
(`activation_peaks`, what the exhaustive search reads) or along each rank's program order
(`order_peaks`, what the pruned search reads, with no timeline at all).

Why they agree: each kind's bytes are added when its action starts and released when it ends,
and a rank runs its actions one after the other, in program order, each taking some time. So
its events fall in the order +added₀, −released₀, +added₁, … whatever the costs: the timeline's
sort (by time, releases first at one instant) lists them just so. `order_peaks` sums the same
numbers in the same order, so it gives the same bytes to the last bit; tests/test_plan_prune.py
holds the two equal on every candidate of a calibrated, a shaped and a custom plan. (An action
that takes no time at all would break the argument: none of the planner's sources has one.)
"""
from __future__ import annotations

from itertools import repeat
from typing import NamedTuple
from operator import itemgetter

import numpy as np

from ..schedules.actions import Action
from ..schedules.kinds import byte_rules
from .rows import KIND_NAMES, Rows

Table = dict[str, tuple[np.ndarray, np.ndarray]]     # kind -> (added, released) per stage


def kind_table(table: dict[str, list[tuple[float, float]]]) -> Table:
    """A source's byte table (byte rule -> [(added, released)] per stage) as each kind's:
    the bytes of its spec's rule."""
    return {kind: tuple(np.array(table[rule]).T) for kind, rule in byte_rules().items()
            if rule in table}


def activation_peaks(timeline, table: Table) -> list[int]:
    """Peak live activation bytes per rank along a timeline, `table[kind] = (added at start,
    released at end)` per stage. At one instant, releases count before additions."""
    parts = [(e[0], part, e[2], e[3]) for e in timeline.events for part in e[1].parts] \
        if set(map(type, map(itemgetter(1), timeline.events))) != {Action} else timeline.events
    n, kinds = len(parts), list(table)
    code = {kind: i for i, kind in enumerate(kinds)}
    action = list(map(itemgetter(1), parts))
    kind = np.fromiter(map(code.get, map(itemgetter(1), action), repeat(-1)), np.int64, n)
    stage = np.fromiter(map(itemgetter(0), action), np.int64, n)
    rank = np.fromiter(map(itemgetter(0), parts), np.int64, n)
    start, end = (np.fromiter(map(itemgetter(i), parts), float, n) for i in (2, 3))
    mine = kind >= 0
    kind, stage, rank, start, end = kind[mine], stage[mine], rank[mine], start[mine], end[mine]
    add = np.array([table[k][0] for k in kinds])[kind, stage]
    release = np.array([table[k][1] for k in kinds])[kind, stage]
    rank, when = np.concatenate((rank, rank)), np.concatenate((start, end))
    delta = np.concatenate((add, -release))
    first = np.concatenate((np.ones(len(add)), np.zeros(len(release))))   # releases first
    sort = np.lexsort((first, when, rank))
    rank = rank[sort]
    present = np.flatnonzero(np.bincount(rank, minlength=timeline.ranks))
    return _peaks(np.cumsum(delta[sort]), np.searchsorted(rank, present), present.tolist(),
                  timeline.ranks)


class Stacked(NamedTuple):
    """A `Table` as two arrays, kind (in `kinds`' order) × stage: what `order_peaks` gathers
    from (made once per table: a plan's candidates share a handful of tables)."""
    kinds: tuple[str, ...]
    added: np.ndarray
    released: np.ndarray


def stacked(table: dict[str, list[tuple[float, float]]]) -> Stacked:
    """`kind_table(table)` stacked: a source's byte table read once (each rule one row)."""
    rules = {kind: rule for kind, rule in byte_rules().items() if rule in table}
    used = list(dict.fromkeys(rules.values()))
    rows = np.array([table[rule] for rule in used])       # rule × stage × (added, released)
    pick = [used.index(rule) for rule in rules.values()]
    return Stacked(tuple(rules), rows[pick, :, 0], rows[pick, :, 1])


def order_peaks(rows: Rows, table: Stacked) -> list[int]:
    """`activation_peaks` read along the ranks' program order (see the module's docstring)."""
    events = _events(rows, table.kinds)
    add = table.added[events.kind, events.stage]
    release = table.released[events.kind, events.stage]
    delta = np.empty(2 * len(add), np.result_type(add, release))
    delta[0::2], delta[1::2] = add, -release          # +added, −released, action by action
    return _peaks(np.cumsum(delta), events.starts, events.ranks, rows.ranks)


class _Events(NamedTuple):
    kind: np.ndarray      # each counted action's kind, an index in the table's kinds
    stage: np.ndarray
    starts: np.ndarray    # where each rank with counted actions begins, in the events (2 an action)
    ranks: list[int]      # those ranks


def _events(rows: Rows, kinds: tuple[str, ...]) -> _Events:
    """What `order_peaks` reads of the rows for a table of `kinds` (kept on the rows: the
    candidates of a schedule share it)."""
    if kinds not in rows.events:
        code = np.full(len(KIND_NAMES), -1, np.int64)
        for i, kind in enumerate(kinds):
            if kind in KIND_NAMES:
                code[KIND_NAMES.index(kind)] = i
        kind = code[rows.kind]
        mine = kind >= 0
        rank = rows.rank[mine]
        ranks = np.flatnonzero(np.bincount(rank, minlength=rows.ranks))
        starts = 2 * np.searchsorted(rank, ranks)
        rows.events[kinds] = _Events(kind[mine], rows.stage[mine], starts, ranks.tolist())
    return rows.events[kinds]


def _peaks(level: np.ndarray, starts: np.ndarray, present: list[int], ranks: int) -> list[int]:
    """Each rank's highest level above where it started (0 for a rank with no events): `level`
    is the running sum over the events of every rank, rank after rank, and rank present[i]'s
    begin at starts[i]. (max(x − c) is max(x) − c in floats too: subtracting c rounds
    monotonically.)"""
    peaks = [0] * ranks
    if len(starts):
        before = np.where(starts > 0, level[starts - 1], 0)      # the level it started from
        high = np.maximum(np.maximum.reduceat(level, starts) - before, 0)
        for r, h in zip(present, high.tolist()):
            peaks[r] = int(h)
    return peaks
