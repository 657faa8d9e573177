"""A schedule as three arrays, for the pruned search (plan.py): what a candidate's memory and
the lower bound on its step time read, without a Python object per action.

`Rows` lists every action rank by rank in program order: its rank, its kind (an index in
`KIND_NAMES`) and its stage. A rank runs its actions one after the other in that order, so
whatever only depends on the order of a rank's own actions — its peak of live activations
(peaks.py), the work it must do (bound.py) — is read here instead of on a simulated timeline.
"""
from __future__ import annotations

from itertools import chain, repeat
from operator import itemgetter

import numpy as np

from ..schedules.actions import Action
from ..schedules.kinds import KIND_SPECS
from ..techniques.recompute import RECOMPUTE
from ..techniques.recompute_placement import BACKWARDS

KIND_NAMES = tuple(KIND_SPECS)        # kinds by number (a kind registered later: its own run)
CODE = {kind: i for i, kind in enumerate(KIND_NAMES)}


class Rows:
    """`rank[i]`, `kind[i]` and `stage[i]` of action i, rank after rank in program order;
    `ranks` and `placement` (stage -> rank) as the schedule's: what a source's `model` reads
    of a schedule."""
    __slots__ = ("rank", "kind", "stage", "ranks", "placement", "crossing", "tally",
                 "events")

    def __init__(self, rank: np.ndarray, kind: np.ndarray, stage: np.ndarray, ranks: int,
                 placement: tuple[int, ...]):
        self.rank, self.kind, self.stage = rank, kind, stage
        self.ranks, self.placement = ranks, placement
        place = np.asarray(placement)
        self.crossing = place[1:] != place[:-1]        # stage s to s + 1 changes rank
        self.tally = None                              # what bound.py reads, once counted
        self.events: dict = {}                         # what peaks.py reads, per table's kinds

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank `rank` holds (as `Schedule.stages_of`: a source reads it)."""
        return [s for s, r in enumerate(self.placement) if r == rank]


def rows_of(schedule) -> Rows | None:
    """The schedule's rows; None when a step is a compound (its parts share one start and one
    end, which program order alone does not say) or a kind is not registered."""
    flat = list(chain.from_iterable(schedule.actions))
    if set(map(type, flat)) != {Action}:
        return None
    kind = np.fromiter(map(CODE.get, map(itemgetter(1), flat), repeat(-1)), np.int64, len(flat))
    if len(kind) and kind.min() < 0:
        return None
    stage = np.fromiter(map(itemgetter(0), flat), np.int64, len(flat))
    rank = np.repeat(np.arange(schedule.ranks), [len(acts) for acts in schedule.actions])
    return Rows(rank, kind, stage, schedule.ranks, tuple(schedule.placement))


def with_recompute_rows(rows: Rows) -> Rows:
    """The rows of `with_recompute(schedule)`: an `R` of the same stage right before every
    backward (B, or I when split), as recompute_placement.py places it."""
    backward = np.isin(rows.kind, [CODE[k] for k in BACKWARDS])
    take = np.repeat(np.arange(len(rows.kind)), 1 + backward)     # each backward twice
    first = np.ones(len(take), bool)
    first[1:] = take[1:] != take[:-1]                 # the first copy of a doubled row is its R
    kind = rows.kind[take]
    kind[first & backward[take]] = CODE[RECOMPUTE]
    return Rows(rows.rank[take], kind, rows.stage[take], rows.ranks, rows.placement)
