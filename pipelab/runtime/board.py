"""A progress board in shared memory: where each rank is, so the parent can tell a hang.

Each rank writes five numbers whenever it changes state (one ~0.2 µs write, no locks,
no messages): training step, position in its action list, state, detail (which receive) and
the time it entered the state. The parent reads the board to notice a rank that has stopped
moving and to say exactly where it stopped.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass

SETUP, RECV, RUN, SENDS, SYNC, OPTIM, DONE = range(7)
STATE_NAMES = ("setting up", "receiving", "running", "waiting for sends", "at the step barrier",
               "in the optimizer", "done")
_FIELDS = 5
_WRITE = struct.Struct(f"{_FIELDS}d").pack_into   # one call writes a rank's row


@dataclass
class RankState:
    rank: int
    step: int           # training step
    position: int       # index into the rank's action list
    state: int
    detail: int         # for RECV: which of the step's receives
    since: float        # time.perf_counter() when the state began (system-wide monotonic clock)


class Board:
    """View over a shared array of `ranks * 5` doubles (created by the parent)."""

    def __init__(self, array, ranks: int):
        self.array, self.ranks = array, ranks

    @classmethod
    def create(cls, ctx, ranks: int) -> "Board":
        return cls(ctx.RawArray("d", ranks * _FIELDS), ranks)

    def set(self, rank: int, step: int, position: int, state: int, detail: int = 0) -> None:
        # One struct write into the shared buffer instead of five ctypes item assignments:
        # called two or three times per action, it is part of every action's overhead.
        _WRITE(self.array, rank * _FIELDS * 8, step, position, state, detail, time.perf_counter())

    def reset(self) -> None:
        now = time.perf_counter()
        for rank in range(self.ranks):
            self.array[rank * _FIELDS:(rank + 1) * _FIELDS] = [0, 0, SETUP, 0, now]

    def read(self) -> list[RankState]:
        values = self.array[:]
        return [RankState(r, *(int(v) for v in values[r * _FIELDS:r * _FIELDS + 4]),
                          since=values[r * _FIELDS + 4]) for r in range(self.ranks)]


class NoBoard:
    """Stand-in under torchrun, where no parent watches."""

    def set(self, *args, **kwargs) -> None:
        pass
