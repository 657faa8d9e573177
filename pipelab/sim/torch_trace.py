"""A torch pipelining run read back: torch.profiler Chrome traces as a measured Timeline.

Torch's `_PipelineScheduleRuntime` runs every action of its program inside a profiler region
named `PP:<action>` (`PP:0F3`, `PP:1I2`, `PP:(0F3;3B1)OVERLAP_F_B`, `PP:0SEND_F1`, ...). A
profiler trace per rank (`torch.profiler.profile(...).export_chrome_trace(path)`, or
`cluster.run(..., engine="torch", torch_trace=DIR)`) therefore holds each compute action's
span. Read here:

- one event per compute region (F, B, I, W, an overlapped pair as one event); the sends,
  receives, REDUCE_GRAD and FSDP's UNSHARD/RESHARD regions are left out (pipelab derives its
  own communication);
- the waits for received inputs are idle time, moved to the event's start, as in pipelab's own
  measured timelines: torch waits for an action's inputs inside its region (an overlapped pair
  waits for its backward's gradient between its two halves). The backend marks each receive
  with a region of its own (`gloo:recv`, from its posting to its completion); the thread was
  blocked from its last operator before a completion up to that completion. A trace without
  receive regions (another backend) starts each event at its first operator instead;
- times in seconds from the earliest event of any rank. Traces of one machine share its clock;
  across machines the profilers' clocks are only approximately aligned;
- a trace of several steps: `step` picks one (default the last), every action occurring once
  per step.
"""
from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import Sequence

from ..schedules.base import Schedule
from ..schedules.torch_format import parse_torch_cell, schedule_from_rows
from .timeline import Event, Timeline

REGION = "PP:"          # torch's prefix of its per-action profiler regions
_RECEIVE = re.compile(r"^[a-z]+:recv")     # a backend's receive region: gloo:recv (nccl:recv)
_RANK_FILE = re.compile(r"(\d+)")


def trace_files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """The trace of each rank, in rank order: a list as given, or a folder's `*.json` files
    ordered by the number in their names (`rank0.json`, `rank1.json`, ...)."""
    if isinstance(paths, (str, Path)):
        folder = Path(paths)
        if not folder.is_dir():
            raise ValueError(f"paths must be a folder of traces or a list of trace files, one "
                             f"per rank in rank order; {str(folder)!r} is not a folder")
        found = [p for p in folder.glob("*.json") if _RANK_FILE.search(p.stem)]
        if not found:
            raise ValueError(f"no trace in {str(folder)!r}: expected rank0.json, rank1.json, ...")
        files = sorted(found, key=lambda p: int(_RANK_FILE.findall(p.stem)[-1]))
    else:
        files = [Path(p) for p in paths]
        if not files:
            raise ValueError("paths lists no trace: give one torch.profiler trace per rank")
    for path in files:
        if not path.is_file():
            raise ValueError(f"trace {str(path)!r} does not exist")
    return files


def _regions(path: Path) -> tuple[list, list, list]:
    """(the PP regions of one trace as (text, start µs, end µs, thread), in start order; the
    operators as (thread, start µs); the ends of the backend's receive regions, µs, sorted)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read trace {str(path)!r} as a Chrome trace (JSON): {err}") \
            from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{str(path)!r} is not a Chrome trace: no traceEvents list")
    regions, ops, received = [], [], []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        name = str(e.get("name", ""))
        start = float(e["ts"])
        if name.startswith(REGION) and e.get("cat", "user_annotation") == "user_annotation":
            regions.append((name[len(REGION):], start, start + float(e.get("dur", 0.0)),
                            e.get("tid")))
        elif e.get("cat") == "cpu_op":
            ops.append((e.get("tid"), start, start + float(e.get("dur", 0.0))))
        elif _RECEIVE.search(name):
            received.append(start + float(e.get("dur", 0.0)))
    regions.sort(key=lambda r: r[1])
    ops.sort(key=lambda o: o[1])
    return regions, ops, sorted(received)


class _Thread:
    """One thread's operators, to ask what it did before a moment."""

    def __init__(self, ops: list):
        self.starts = [o[1] for o in ops]
        self.latest_end = list(accumulate((o[2] for o in ops), max))   # over the ops so far

    def blocked(self, received: list, start: float, end: float) -> float:
        """Seconds (µs) the thread waited inside [start, end] for receives: before each
        completion inside it, from its last operator's end (or `start`) to the completion,
        unless an operator was running across the completion."""
        waited = 0.0
        for done in received[bisect_left(received, start):bisect_right(received, end)]:
            i = bisect_left(self.starts, done)
            busy_until = max(start, self.latest_end[i - 1]) if i else start
            waited += max(0.0, done - busy_until)
        return waited

    def first_operator(self, start: float, end: float) -> float:
        """When the first operator inside [start, end] began (start if none)."""
        i = bisect_left(self.starts, start)
        return self.starts[i] if i < len(self.starts) and self.starts[i] <= end else start


def read_torch_trace(paths, schedule: Schedule | None = None, step: int = -1) -> Timeline:
    """The measured Timeline of a torch pipelining run from one torch.profiler Chrome trace per
    rank (see the module's notes). With `schedule`, each rank's events must be its actions in
    its order (ValueError naming the first difference); without, the schedule is read from the
    traces (placement inferred as torch infers it) and validated."""
    files = trace_files(paths)
    rows, spans = [], []
    for rank, path in enumerate(files):
        regions, ops, received = _regions(path)
        threads = {tid: _Thread([o for o in ops if o[0] == tid]) for tid in {r[3] for r in regions}}
        items = []
        for text, start, end, tid in regions:
            item = parse_torch_cell(text, f"{path.name}, region {REGION}{text}")
            if item is not None:
                thread = threads[tid]
                began = start + thread.blocked(received, start, end) if received else \
                    thread.first_operator(start, end)
                items.append((item, began, end))
        if not items:
            raise ValueError(f"{str(path)!r} holds no {REGION}<action> region of torch's "
                             f"pipelining runtime: record a step of a torch schedule with "
                             f"torch.profiler")
        items = _one_step(items, step, path)
        rows.append([item for item, _, _ in items])
        spans.append(items)
    if schedule is None:
        schedule = schedule_from_rows(Schedule, rows, None, "torch trace")
    else:
        _check_order(schedule, rows)
    origin = min(start for items in spans for _, start, _ in items)
    events = [Event(rank, item, (start - origin) * 1e-6, (end - origin) * 1e-6)
              for rank, items in enumerate(spans) for item, start, end in items]
    return Timeline(events, len(files), source="measured", schedule=schedule,
                    title=f"{schedule.name}: measured on torch's runtime (profiler trace)")


def _one_step(items: list, step: int, path: Path) -> list:
    """The events of one step of a trace that recorded several (each action once a step)."""
    seen = Counter(str(item) for item, _, _ in items)
    steps = set(seen.values())
    if steps == {1} and step in (0, -1):
        return items
    if len(steps) != 1:
        raise ValueError(f"{str(path)!r}: its actions occur different numbers of times "
                         f"({sorted(steps)}): not whole steps of one schedule")
    count = steps.pop()
    if not -count <= step < count:
        raise ValueError(f"step {step} is out of range: {str(path)!r} holds {count} steps")
    wanted, occurrence = step % count, Counter()
    out = []
    for entry in items:
        key = str(entry[0])
        if occurrence[key] == wanted:
            out.append(entry)
        occurrence[key] += 1
    return out


def _check_order(schedule: Schedule, rows: list) -> None:
    if len(rows) != schedule.ranks:
        raise ValueError(f"{len(rows)} trace(s) for a schedule of {schedule.ranks} ranks: give "
                         f"one trace per rank")
    for rank, (traced, ours) in enumerate(zip(rows, schedule.actions)):
        if traced == ours:
            continue
        at = next((i for i, (a, b) in enumerate(zip(traced, ours)) if a != b),
                  min(len(traced), len(ours)))
        got = str(traced[at]) if at < len(traced) else "nothing"
        want = str(ours[at]) if at < len(ours) else "nothing"
        raise ValueError(f"rank {rank}'s trace runs {got} at position {at}, where schedule "
                         f"{schedule.name!r} has {want} ({len(traced)} traced actions, "
                         f"{len(ours)} scheduled)")
