"""Timeline: what ran where and when — simulated, measured or replayed, always the same type.

Metrics use two bubble conventions, named apart so they are never confused:
`bubble_fraction()` is the idle share of the makespan ((p−1)/(m+p−1) for GPipe) and
`bubble_ratio()` is idle time over busy time ((p−1)/m for GPipe).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from .schedules.actions import Action

SOURCES = ("simulated", "measured", "replayed")


class Event(NamedTuple):
    rank: int
    action: Action
    start: float
    end: float
    cpu: float | None = None        # thread CPU seconds, for measured runs

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timeline:
    """Events per rank plus an activation-memory curve per rank."""

    def __init__(self, events: list[Event], ranks: int, source: str = "simulated",
                 memory: dict[int, list[tuple[float, float]]] | None = None,
                 memory_unit: str = "units", title: str = "", time_unit: str = "s"):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        self.events = sorted(events, key=lambda e: (e.start, e.rank))
        self.ranks = ranks
        self.source = source
        self.memory = memory or {r: [] for r in range(ranks)}
        self.memory_unit = memory_unit
        self.title = title
        self.time_unit = time_unit

    # --- time --------------------------------------------------------------------------------
    @property
    def start(self) -> float:
        return min((e.start for e in self.events), default=0.0)

    @property
    def makespan(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - self.start

    def busy(self) -> dict[int, float]:
        """Busy (computing) time per rank."""
        out = {r: 0.0 for r in range(self.ranks)}
        for e in self.events:
            out[e.rank] += e.duration
        return out

    def idle(self) -> dict[int, float]:
        return {r: self.makespan - b for r, b in self.busy().items()}

    def bubble_fraction(self) -> float:
        """Idle share of the makespan over all ranks: (p−1)/(m+p−1) for GPipe."""
        total = self.ranks * self.makespan
        return 0.0 if total == 0 else 1.0 - sum(self.busy().values()) / total

    def bubble_ratio(self) -> float:
        """Idle time over ideal (busy) compute time: (p−1)/m for GPipe; can exceed 1."""
        busy = sum(self.busy().values())
        return 0.0 if busy == 0 else (self.ranks * self.makespan - busy) / busy

    def events_of(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]

    # --- memory ------------------------------------------------------------------------------
    def memory_curve(self, rank: int) -> list[tuple[float, float]]:
        """(time, live activations) steps for one rank, in `memory_unit`."""
        return self.memory.get(rank, [])

    def peak_activations(self) -> dict[int, float]:
        """Peak live activations per rank (microbatch-stage units when simulated, bytes when measured)."""
        return {r: max((level for _, level in self.memory_curve(r)), default=0.0)
                for r in range(self.ranks)}

    # --- output ------------------------------------------------------------------------------
    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write a Chrome trace (open in Perfetto / chrome://tracing): one track per rank."""
        scale = 1e6   # trace times are microseconds; one cost unit shows as one second
        t0 = self.start
        trace = [{"name": "process_name", "ph": "M", "pid": 0,
                  "args": {"name": f"pipelab ({self.source})"}}]
        for r in range(self.ranks):
            trace.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                          "args": {"name": f"rank {r}"}})
        for e in self.events:
            args = {"stage": e.action.stage, "microbatch": e.action.microbatch}
            if e.cpu is not None:
                args["cpu_s"] = e.cpu
            trace.append({"name": str(e.action), "cat": e.action.kind, "ph": "X", "pid": 0,
                          "tid": e.rank, "ts": (e.start - t0) * scale,
                          "dur": e.duration * scale, "args": args})
        for r, curve in self.memory.items():
            for t, level in curve:
                trace.append({"name": f"activations rank {r}", "ph": "C", "pid": 0,
                              "ts": (t - t0) * scale, "args": {self.memory_unit: level}})
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": trace}))
        return path

    def plot(self, ax=None, title: str | None = None):
        """Gantt chart: one row per rank, a colour per action kind, microbatch numbers in boxes."""
        from .plots import plot_gantt
        return plot_gantt(self, ax=ax, title=title)

    def plot_memory(self, ax=None, title: str | None = None):
        from .plots import plot_memory
        return plot_memory(self, ax=ax, title=title)

    def summary(self) -> dict:
        return {"source": self.source, "makespan": self.makespan,
                "bubble_fraction": self.bubble_fraction(), "bubble_ratio": self.bubble_ratio(),
                "peak_activations": self.peak_activations()}

    def __repr__(self) -> str:
        return (f"Timeline({self.source}, ranks={self.ranks}, events={len(self.events)}, "
                f"makespan={self.makespan:.4g}{self.time_unit}, "
                f"bubble_fraction={self.bubble_fraction():.3f})")
