"""A progress board in shared memory: where each rank is, so the parent can tell a hang.

Each rank writes five numbers whenever it changes state (one ~0.3 µs write, no locks,
no messages): training step, position in its action list, state, detail (which receive) and
the time it entered the state. The parent reads the board to notice a rank that has stopped
moving and to say exactly where it stopped.

The parent reads while the ranks write, so a row must never pass through a state that means
something else. `struct.pack_into` straight into the shared buffer does: CPython zeroes the
target bytes first and then fills the fields one by one, so a read in between sees
"setting up since time 0" — a rank idle for the machine's whole uptime, and the watchdog
raised PipelineTimeout("no progress for 9479 s") at the start of a run on a loaded machine.
A row is therefore packed into a private bytes object and copied in with one memcpy: each
field then holds its old or its new value, never zero.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass

SETUP, RECV, RUN, SENDS, SYNC, OPTIM, DONE = range(7)
POLL = 0.1   # seconds between the parent's reads of the board while it waits for the ranks
# The detail of a RUN state: what the action is waiting in (0: computing). A technique's code
# that blocks inside an action marks the board with its own detail.
IN_REDUCTION = 1           # waiting for a gradient all-reduce it launched (collectives.py)
IN_ALL_TO_ALL = 2          # an expert all-to-all inside the action (techniques/expert.py)
_FIELDS = 5
_PACK = struct.Struct(f"{_FIELDS}d").pack          # a row, packed privately (see above)
_ROW = _FIELDS * 8                                  # bytes per row


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
        self._bytes = memoryview(array).cast("B")      # byte view: a row is one slice copy

    @classmethod
    def create(cls, ctx, ranks: int) -> "Board":
        return cls(ctx.RawArray("d", ranks * _FIELDS), ranks)

    def set(self, rank: int, step: int, position: int, state: int, detail: int = 0) -> None:
        # One slice copy instead of five ctypes item assignments (called two or three times
        # per action, it is part of every action's overhead), and never pack_into: see above.
        at = rank * _ROW
        self._bytes[at:at + _ROW] = _PACK(step, position, state, detail, time.perf_counter())

    def mark(self, rank: int, detail: int) -> None:
        """Change only the detail of a rank's state (and its time): inside a running action,
        say that it now waits in a collective of its own (or no longer does, detail 0)."""
        row = rank * _FIELDS
        self.array[row + 3] = detail
        self.array[row + 4] = time.perf_counter()

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

    def mark(self, *args, **kwargs) -> None:
        pass
