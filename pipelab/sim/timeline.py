"""Timeline: what ran where and when — simulated, measured or replayed, always the same type.

Metrics use two bubble conventions, named apart so they are never confused:
`bubble_fraction()` is the idle share of the makespan ((p−1)/(m+p−1) for GPipe) and
`bubble_ratio()` is idle time over busy time ((p−1)/m for GPipe).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..support.atomic import replacing
from ..support.drawers import draw
from ..schedules.actions import Action
from ..schedules.kinds import (BACKWARD, FORWARD, INPUT_GRAD, byte_rules, collective_kinds,
                               kinds_with_role, side_lanes)
from ..schedules.base import Schedule
from ..schedules.graph import members_of

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


def _by_start_then_rank(events: list[Event]) -> list[Event]:
    """The events sorted by (start, rank), stably (numpy's lexsort: timelines of 10^5 events)."""
    n = len(events)
    start = np.fromiter(map(itemgetter(2), events), float, n)
    rank = np.fromiter(map(itemgetter(0), events), np.int64, n)
    return [events[i] for i in np.lexsort((rank, start)).tolist()]


@dataclass(frozen=True)
class PathSummary:
    """A critical path in numbers (times in the timeline's unit).

    `crossings`: how often the path changes rank (each change is a message, whatever it
    costs); `messages`: the crossings that cost latency (`comm_before` > 0; 0 when c = 0, and
    for measured timelines, whose latency shows as `waiting`)."""
    actions: int
    compute: float
    comm: float
    waiting: float
    crossings: int
    messages: int

    @property
    def total(self) -> float:
        """compute + comm + waiting: the makespan, for a path from `critical_path()`."""
        return self.compute + self.comm + self.waiting


@dataclass(frozen=True)
class PathStep:
    """One link of a critical path: `event` started `comm_before` (a message crossing ranks)
    plus `wait_before` (idle time) after its predecessor on the path ended.

    `edge` says why the predecessor binds: "start" (the first step), "data" (the event consumes
    the predecessor's output) or "rank" (the same rank runs it next)."""
    event: Event
    wait_before: float
    comm_before: float
    edge: str

    @property
    def duration(self) -> float:
        return self.event.duration

    def __repr__(self) -> str:
        return (f"PathStep({self.event.action} on rank {self.event.rank}, "
                f"{self.event.start:.4g}-{self.event.end:.4g}, after {self.edge}"
                f"{f' +{self.comm_before:.3g} comm' if self.comm_before else ''}"
                f"{f' +{self.wait_before:.3g} wait' if self.wait_before else ''})")


class CriticalPath(list):
    """`Timeline.critical_path()`: a list of PathStep that prints as a table, one line a step."""

    def __repr__(self) -> str:
        if not self:
            return "CriticalPath([])"
        lines = [f"critical path: {len(self)} steps, {self[0].event.start:.4g} -> "
                 f"{self[-1].event.end:.4g}",
                 f"{'action':>10} {'rank':>4} {'start':>10} {'duration':>10} {'comm':>8} "
                 f"{'wait':>8}  after"]
        lines += [f"{str(p.event.action):>10} {p.event.rank:>4} {p.event.start:>10.4g} "
                  f"{p.duration:>10.4g} {p.comm_before:>8.3g} {p.wait_before:>8.3g}  {p.edge}"
                  for p in self]
        return "\n".join(lines)

    __str__ = __repr__


class Timeline:
    """Events per rank plus an activation-memory curve per rank.

    `schedule` and `comm` (set by `simulate()`) say which dependency graph and message cost
    produced the events; `critical_path()` and the player's "waiting for" read them. A timeline
    without a schedule (e.g. measured) has one rebuilt from its events when needed.
    """

    def __init__(self, events: list[Event], ranks: int, source: str = "simulated",
                 memory: dict[int, list[tuple[float, float]]] | None = None,
                 memory_unit: str = "units", title: str = "", time_unit: str = "s",
                 schedule=None, comm: float | None = None, presorted: bool = False):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        # `presorted`: the events are in (start, rank) order already (the simulator sorts its
        # arrays), so the sort is skipped.
        self.events = events if presorted else _by_start_then_rank(events)
        self.ranks = ranks
        self.source = source
        self.memory = memory or {r: [] for r in range(ranks)}
        self.memory_unit = memory_unit
        self.title = title
        self.time_unit = time_unit
        self.schedule = schedule
        self.comm = comm

    @classmethod
    def from_torch_trace(cls, paths, schedule=None, step: int = -1) -> "Timeline":
        """The measured timeline of a torch.distributed.pipelining run, read from one
        torch.profiler Chrome trace per rank (a list in rank order, or a folder of
        rank<r>.json): one event per compute action, from torch's `PP:<action>` regions
        (torch_trace.py). `pl.Costs.fit(timeline, stages)` then fits per-stage costs."""
        from .torch_trace import read_torch_trace
        return read_torch_trace(paths, schedule=schedule, step=step)

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
        """Busy (computing) time per rank; events beside the compute (a gradient all-reduce on
        the communication lane, a copy on the copy lane) are not counted."""
        out = {r: 0.0 for r in range(self.ranks)}
        beside = side_lanes()
        for e in self.events:
            if e.action.parts[0].kind not in beside:
                out[e.rank] += e.duration
        return out

    def side_events(self, lane: str) -> list[Event]:
        """Events on the ranks' `lane` ("comm" or "copy"), in start order."""
        beside = side_lanes()
        return [e for e in self.events if beside.get(e.action.parts[0].kind) == lane]

    def comm_events(self) -> list[Event]:
        """Events on the ranks' communication lanes (gradient all-reduces), in start order."""
        return self.side_events("comm")

    def compute_end(self) -> float:
        """When the last compute (not side-lane) action ends, relative to `start`."""
        beside = side_lanes()
        return max((e.end for e in self.events if e.action.parts[0].kind not in beside),
                   default=self.start) - self.start

    def reduction_overlap(self) -> dict:
        """How much of the communication-lane time (the gradient all-reduces) hides behind
        compute: `total` (summed durations), `hidden` (the parts of them before the last
        compute action ends, anywhere in the pipeline), `exposed` (how far the step runs past
        that end: makespan − compute end) and `hidden_share` = hidden / total."""
        events, end = self.comm_events(), self.start + self.compute_end()
        total = sum(e.duration for e in events)
        hidden = sum(max(0.0, min(e.end, end) - e.start) for e in events)
        return {"total": total, "hidden": hidden, "exposed": self.makespan - self.compute_end(),
                "hidden_share": hidden / total if total else 1.0}

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

    # --- structure: dependencies, critical path, phases ------------------------------------
    def dependency_schedule(self):
        """The schedule behind the events: `self.schedule`, or one rebuilt from the events
        (each rank's actions in start order, stage placement as observed)."""
        if self.schedule is not None:
            return self.schedule
        per_rank: list[list[Action]] = [[] for _ in range(self.ranks)]
        placement: dict[int, int] = {}
        for e in self.events:                      # already in start order
            per_rank[e.rank].append(e.action)
            placement.setdefault(e.action.stage, e.rank)
        stages = max(placement, default=-1) + 1
        microbatches = max((e.action.microbatch for e in self.events), default=0) + 1
        return Schedule(per_rank, tuple(placement.get(s, 0) for s in range(stages)),
                        microbatches, name=self.title or "timeline")

    def dependencies_of(self, event: Event) -> list[Event]:
        """Events whose output `event` consumes (its data dependencies), as events here."""
        by_action = self._by_action()
        try:
            deps = self.dependency_schedule().dependencies(event.action)
        except ValueError:        # a kind without a dependency rule: only rank order binds it
            return []
        return [by_action[d] for d in deps if d in by_action]

    def _by_action(self) -> dict[Action, Event]:
        cache = getattr(self, "_action_index", None)
        if cache is None or cache[0] is not self.events:
            cache = (self.events, {part: e for e in self.events for part in e.action.parts})
            self._action_index = cache
        return cache[1]

    def critical_path(self) -> "CriticalPath":
        """The chain of actions that sets the makespan, from time 0 to the last end.

        Walks back from the action that ends last: each step's predecessor is whichever input
        arrived last — a data dependency (its end + `comm` when it crosses ranks) or the
        previous action on the same rank. On a tie a data dependency wins (it shows where the
        messages sit on the path). For a simulated timeline the binding predecessor arrives
        exactly at the start, so every `wait_before` after the first is 0 and
        Σ(duration + comm_before + wait_before) == makespan (up to float rounding of the
        costs themselves; exact for costs such as 1, 0.5, 0.25). For a measured timeline the
        gaps (`wait_before`) hold what the model does not: latency, jitter, Python overhead.
        """
        if not self.events:
            return []
        comm = self.comm or 0.0
        previous = self._lane_predecessors()
        last = max(self.events, key=lambda e: (e.end, e.rank))
        steps: list[PathStep] = []
        event = last
        while True:
            best = None         # (arrival, preference, predecessor, comm, edge)
            for dep in self.dependencies_of(event):
                hop = comm if self.crosses(dep, event) else 0.0
                cand = (dep.end + hop, 1, dep, hop, "data")
                if best is None or cand[:2] > best[:2]:
                    best = cand
            for before in previous.get(event, ()):
                cand = (before.end, 0, before, 0.0, "rank")
                if best is None or cand[:2] > best[:2]:
                    best = cand
            if best is None:
                steps.append(PathStep(event, event.start - self.start, 0.0, "start"))
                break
            arrival, _, pred, hop, edge = best
            steps.append(PathStep(event, event.start - arrival, hop, edge))
            event = pred
        steps.reverse()
        return CriticalPath(steps)

    def ranks_running(self, event: Event) -> tuple[int, ...]:
        """The ranks that ran the event's action: its members for a collective, else its rank."""
        action = event.action
        if len(action.parts) == 1 and action.kind in collective_kinds():
            return members_of(self.dependency_schedule(), action)
        return (event.rank,)

    def crosses(self, producer: Event, consumer: Event) -> bool:
        """Does the producer's output cross ranks to reach the consumer (a message, `comm`)?
        As the simulator charges it: some rank running the consumer did not run the producer."""
        made = self.ranks_running(producer)
        return any(r not in made for r in self.ranks_running(consumer))

    def _lane_predecessors(self) -> dict[Event, list[Event]]:
        """Per event, the events that may have held up its start on its own ranks: the previous
        one on its lane (compute, the communication or the copy lane) in program order; for a
        collective, that of every member, and on a side lane also the compute each member ran
        just before reaching it (a collective starts once every member has arrived)."""
        beside, together = side_lanes(), collective_kinds()
        by_rank = {(e.rank, e.action): e for e in self.events}
        sched = self.dependency_schedule()
        lane_before: dict[tuple[int, object], tuple[Event | None, Event | None]] = {}
        for r in range(self.ranks):
            order = sched.actions[r] if r < len(sched.actions) else []
            latest: dict[str | None, Event] = {}      # lane (None: the compute) -> last event
            for item in order:
                e = by_rank.get((r, item))
                if e is None:
                    continue
                aside = beside.get(item.parts[0].kind)
                lane_before[(r, item)] = (latest.get(aside), latest.get(None) if aside else None)
                latest[aside] = e
        out: dict[Event, list[Event]] = {}
        for e in self.events:
            if (e.rank, e.action) not in lane_before:      # no program order: start order
                continue
            members = self.ranks_running(e) if e.action.parts[0].kind in together else None
            found = []
            for m in (members or (e.rank,)):
                same, issued = lane_before.get((m, e.action), (None, None))
                found += [x for x in (same, issued if members else None) if x is not None]
            out[e] = found
        if not lane_before:
            for r in range(self.ranks):
                mine = self.events_of(r)
                out.update((b, [a]) for a, b in zip(mine, mine[1:]))
        return out

    def path_summary(self, path: list[PathStep] | None = None) -> PathSummary:
        """What the critical path (default: `critical_path()`) is made of: compute, message
        latency, waiting, and how often it changes rank. A simulated timeline's makespan is
        `compute + comm + waiting` (and `compute + crossings × comm` when no step waits)."""
        path = self.critical_path() if path is None else path
        crossings = sum(a.event.rank != b.event.rank for a, b in zip(path, path[1:]))
        return PathSummary(actions=len(path),
                           compute=sum(s.duration for s in path),
                           comm=sum(s.comm_before for s in path),
                           waiting=sum(s.wait_before for s in path),
                           crossings=crossings,
                           messages=sum(1 for s in path if s.comm_before > 0))

    def phases(self) -> dict[int, list[tuple[str, float, float]]]:
        """Per rank, [(phase, start, end)] with times relative to `start`, empty phases left out.

        warm-up: from the rank's first action to its first backward (a kind whose role is a
        full backward or an input gradient: B or I) — forwards only;
        steady: from there to the end of its last forward — forwards and backwards alternate;
        cool-down: from there to its last action's end — backwards (and W passes) only.
        GPipe has no steady phase (every forward comes before every backward); a rank without
        backwards (forward-only timeline) is all warm-up.
        """
        t0, out = self.start, {}
        back, forward = kinds_with_role(BACKWARD, INPUT_GRAD), kinds_with_role(FORWARD)
        for r in range(self.ranks):
            mine = self.events_of(r)
            if not mine:
                out[r] = []
                continue
            begin, finish = mine[0].start - t0, max(e.end for e in mine) - t0
            kinds = [{part.kind for part in e.action.parts} for e in mine]   # a pair has two
            backs = [e.start - t0 for e, k in zip(mine, kinds) if k & back]
            fwd_ends = [e.end - t0 for e, k in zip(mine, kinds) if k & forward]
            first_back = min(backs, default=finish)
            last_fwd = max(fwd_ends, default=begin)
            steady_end = max(first_back, min(last_fwd, finish))
            spans = [("warm-up", begin, first_back), ("steady", first_back, steady_end),
                     ("cool-down", steady_end, finish)]
            out[r] = [(name, a, b) for name, a, b in spans if b > a]
        return out

    # --- memory ------------------------------------------------------------------------------
    def memory_curve(self, rank: int) -> list[tuple[float, float]]:
        """(time, live activations) steps for one rank, in `memory_unit`."""
        return self.memory.get(rank, [])

    def byte_rules(self) -> dict[str, str]:
        """{kind: its byte rule} for the kinds registered with one: how the byte model
        (memory.byte_curves) reads this timeline's actions."""
        return byte_rules()

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
        # Written beside the target and renamed over it: a failure leaves the old file whole.
        with replacing(path) as f:
            json.dump({"traceEvents": trace}, f)
        return Path(path)

    def plot(self, ax=None, title: str | None = None):
        """Gantt chart: one row per rank, a colour per action kind, microbatch numbers in boxes."""
        return draw("gantt", self, ax=ax, title=title)

    def plot_memory(self, ax=None, title: str | None = None):
        return draw("memory", self, ax=ax, title=title)

    def summary(self) -> dict:
        return {"source": self.source, "makespan": self.makespan,
                "bubble_fraction": self.bubble_fraction(), "bubble_ratio": self.bubble_ratio(),
                "peak_activations": self.peak_activations()}

    def __repr__(self) -> str:
        return (f"Timeline({self.source}, ranks={self.ranks}, events={len(self.events)}, "
                f"makespan={self.makespan:.4g}{self.time_unit}, "
                f"bubble_fraction={self.bubble_fraction():.3f})")
