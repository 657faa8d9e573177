"""Simulate a schedule on a cost model: an event simulation of its dependency graph.

Each rank runs its actions in order; an action starts when its rank is free and every input has
arrived, plus `comm` when the input crosses ranks. Closed forms only hold for balanced stages
and zero communication; this always holds.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

from .schedules.actions import Action
from .schedules.gcpause import without_gc
from .schedules.validate import timed_run
from .timeline import Event, Timeline

Cost = float | Sequence[float]
_new = tuple.__new__     # builds an Event without the named tuple's slower constructor


@dataclass
class Costs:
    """Time of one microbatch's action on one stage. A full backward B costs I + W.

    Each of F, I, W is one number for every stage, or a sequence with one number per stage.
    `per_action` (measured seconds per action, as in a replay) overrides the model.

    `per="microbatch"` (the default): F, I, W are one microbatch's costs, so more microbatches
    mean more work. `per="batch"`: F, I, W are the whole batch's costs and `simulate` charges
    each of the schedule's m microbatches 1/m of them — a fixed global batch, so naive (m=1)
    and GPipe (m>1) do the same work and their makespans compare. `comm` (a message's latency)
    and `per_action` (measured times) are never scaled.
    """
    F: Cost = 1.0
    I: Cost = 1.0
    W: Cost = 1.0
    comm: float = 0.0
    per_action: Mapping[Action, float] | None = None
    unit: str = "units"
    per: str = "microbatch"

    def __post_init__(self) -> None:
        if self.per not in ("microbatch", "batch"):
            raise ValueError(f"Costs.per must be 'microbatch' or 'batch', got {self.per!r}")
        for name in ("F", "I", "W", "comm"):
            value = getattr(self, name)
            per_stage = name != "comm" and not isinstance(value, str) and hasattr(value, "__len__")
            values = list(value) if per_stage else [value]
            if not all(_is_time(v) for v in values):
                raise ValueError(f"Costs.{name} must be a finite number >= 0"
                                 f"{' (one number, or one per stage)' if name != 'comm' else ''}, "
                                 f"got {value!r}")
            if per_stage:       # a list whatever came in (a tuple, a numpy array): `of` indexes it
                setattr(self, name, [float(v) for v in values])

    @classmethod
    def from_backward(cls, F: float = 1.0, B: float = 2.0, comm: float = 0.0, **kw) -> "Costs":
        """A model given the full backward B, split evenly into I and W."""
        return cls(F=F, I=B / 2, W=B / 2, comm=comm, **kw)

    @classmethod
    def fit(cls, timeline, stages: int, comm: float = 0.0) -> "Costs":
        """The per-stage cost model a measured timeline implies: median time of each kind on
        each stage (CPU time where it was recorded). A full B is split evenly into I and W."""
        from statistics import median
        samples: dict[tuple[str, int], list[float]] = {}
        for e in timeline.events:
            took = e.cpu if e.cpu is not None else e.duration
            samples.setdefault((e.action.kind, e.action.stage), []).append(took)

        def per_stage(kind: str) -> list[float]:
            return [median(samples[(kind, s)]) if (kind, s) in samples else 0.0 for s in range(stages)]

        forward, full, grad_in, grad_w = (per_stage(k) for k in "FBIW")
        return cls(F=forward, I=[b / 2 + i for b, i in zip(full, grad_in)],
                   W=[b / 2 + w for b, w in zip(full, grad_w)], comm=comm, unit=timeline.time_unit)

    def of(self, kind: str, stage: int) -> float:
        value = getattr(self, kind)
        if isinstance(value, list):
            if stage >= len(value):
                raise ValueError(f"Costs.{kind} has {len(value)} per-stage values, "
                                 f"but the schedule has stage {stage}")
            return float(value[stage])
        return float(value)

    def duration(self, action: Action, microbatches: int = 1) -> float:
        """Time of `action`; with `per="batch"`, its share 1/`microbatches` of the batch's cost."""
        if self.per_action is not None and action in self.per_action:
            return self.per_action[action]
        share = 1.0 / microbatches if self.per == "batch" else 1.0
        if action.kind == "B":
            return (self.of("I", action.stage) + self.of("W", action.stage)) * share
        if action.kind in ("F", "I", "W"):
            return self.of(action.kind, action.stage) * share
        raise ValueError(f"no cost for action kind {action.kind!r}; use per_action")


def _is_time(value) -> bool:
    """A finite, non-negative real number (NaN would silently poison every later start time)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0


@without_gc
def simulate(schedule, costs: Costs | None = None, *, i_frees: float = 0.0,
             source: str = "simulated") -> Timeline:
    """Run the schedule on the cost model. `i_frees` is the share of a forward's activations
    that an input-gradient pass I releases (W releases the rest; a full B releases all)."""
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise ValueError(f"costs must be a pl.Costs (e.g. pl.Costs(F=1, I=1, W=1)), "
                         f"got {type(costs).__name__}")
    if not hasattr(schedule, "execution_order"):
        raise ValueError(f"schedule must be a pl.Schedule, got {type(schedule).__name__}")
    if not 0.0 <= i_frees <= 1.0:
        raise ValueError(f"i_frees must be between 0 and 1, got {i_frees}")
    order = schedule.execution_order()     # validates (once per unchanged schedule)
    unit = [1.0 / len(schedule.stages_of(r)) for r in range(schedule.ranks)]
    events: list[Event] = []
    deltas: dict[int, list[tuple[float, float]]] = {r: [] for r in range(schedule.ranks)}
    released = {"B": 1.0, "I": i_frees, "W": 1.0 - i_frees}     # share of a forward's activations
    timed = timed_run(order, schedule.placement,
                      _cached_durations(costs, schedule.microbatches), costs.comm)
    for rank, action, start, finish in timed:
        events.append(_new(Event, (rank, action, start, finish, None)))
        kind = action[1]
        if kind == "F":
            deltas[rank].append((start, unit[rank]))
        elif released.get(kind):
            deltas[rank].append((finish, -unit[rank] * released[kind]))
    title = schedule.name + (f" (fixed batch, m={schedule.microbatches})"
                             if costs.per == "batch" else "")
    return Timeline(events, schedule.ranks, source=source, memory=_curves(deltas),
                    memory_unit="microbatch-stages", title=title, time_unit=costs.unit,
                    schedule=schedule, comm=costs.comm)


def _cached_durations(costs: Costs, microbatches: int = 1):
    """`costs.duration`, computed once per (kind, stage) unless measured per action."""
    measured = costs.per_action or {}
    model_cost: dict[tuple[str, int], float] = {}

    def duration(action: Action) -> float:
        if measured and action in measured:
            return measured[action]
        key = (action.kind, action.stage)
        if key not in model_cost:
            model_cost[key] = costs.duration(action, microbatches)
        return model_cost[key]
    return duration


def _curves(deltas: dict[int, list[tuple[float, float]]]) -> dict[int, list[tuple[float, float]]]:
    """Step curves; changes at the same instant are merged (a free and an allocation at one
    moment do not dip to the lower level and back)."""
    curves = {}
    for rank, changes in deltas.items():
        level, curve = 0.0, [(0.0, 0.0)]
        for t, delta in changes:    # already in time order: one rank runs one action at a time
            level = round(level + delta, 12)
            if curve[-1][0] == t:
                curve[-1] = (t, level)
            else:
                curve.append((t, level))
        curves[rank] = curve
    return curves
