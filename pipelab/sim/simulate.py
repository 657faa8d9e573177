"""Simulate a schedule on a cost model: an event simulation of its dependency graph.

Each rank runs its actions in order; an action starts when its rank is free and every input has
arrived, plus `comm` when the input crosses ranks. Closed forms only hold for balanced stages
and zero communication; this always holds.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from itertools import repeat
from operator import itemgetter
from typing import Mapping, Sequence

import numpy as np

from .link import Link, check_link
from ..schedules.actions import Action
from ..schedules.gcpause import without_gc
from ..schedules.graph import step_times
from ..schedules.kinds import KIND_SPECS, unit_effects
from .timeline import Event, Timeline
from .tensor_overlap import TP_REDUCE, data_edge, step_time

Cost = float | Sequence[float]
_new = tuple.__new__     # builds an Event without the named tuple's slower constructor


@dataclass
class Costs:
    """Time of one microbatch's action on one stage: a table by kind and stage.

    Each of F, I, W (and B, and any other kind in `kinds`) is one number for every stage, or a
    sequence with one number per stage. A full backward B costs I + W unless given; a compound
    step costs the sum of its parts; a kind missing from the table uses the cost rule it was
    registered with, or is an error naming it. `per_action` (measured seconds per action, as
    in a replay) overrides the model.

    `per="microbatch"` (the default): the table holds one microbatch's costs, so more
    microbatches mean more work. `per="batch"`: it holds the whole batch's costs and `simulate`
    charges each of the schedule's m microbatches 1/m of them — a fixed global batch, so naive
    (m=1) and GPipe (m>1) do the same work and their makespans compare. `comm` (a message's
    latency) and `per_action` (measured times) are never scaled.

    Gradient all-reduces (`AR`, data parallelism) cost a ring all-reduce of the stage's
    `parameter_bytes` (one number, or one per stage) over `replicas` processes (default: what
    the schedule was made for by `with_data_parallel`), at `bandwidth` bytes/s plus `latency`:
    2(n−1)·latency + 2(n−1)/n · bytes / bandwidth; or give `kinds={"AR": ...}` directly. The
    replica sum `G` (bidirectional schedules) costs the same over its two copies.

    `link=pl.Link(latency, bandwidth)` (an emulated link, link.py) prices communication the way
    the runtime's emulation waits: every message crossing ranks adds `link.transfer_time(
    message_bytes)` to `comm`, and the all-reduces use the link's latency and bandwidth (give
    one or the other, not both).

    `overlap=None` (the default, and what our CPUs do): a compound step (DualPipe's F&B pair)
    costs the sum of its parts. `overlap=x` says what a GPU would do — overlap the two — and
    charges the longest part plus `x`: a model, stated as such, never a measurement here.

    Tensor parallelism: `tp_allreduce` (T_AR, one number or one per stage) is the all-reduce
    that ends each forward and each input-gradient pass (kinds registered with `tp_reduce`);
    `tp_overlap` lets it run under other compute where the step allows (tp_overlap.py: a full
    B's W half, a braided compound's other microbatch). 0 (the default): no tensor parallelism.
    `tp_sends_wait=False` is the papers' idealisation: what a braided step sends leaves when its
    compute ends, as if its last all-reduce (the tail) were free.
    """
    F: Cost = 1.0
    I: Cost = 1.0
    W: Cost = 1.0
    comm: float = 0.0
    per_action: Mapping[Action, float] | None = None
    unit: str = "units"
    B: Cost | None = None
    kinds: Mapping[str, Cost] | None = None
    per: str = "microbatch"
    bandwidth: float = math.inf          # bytes/s of a link, for the gradient all-reduce
    latency: float = 0.0                 # seconds added to each all-reduce
    parameter_bytes: Cost = 0.0          # bytes of gradients each stage reduces
    replicas: int | None = None          # data-parallel replicas (None: the schedule's)
    overlap: float | None = None         # None: a compound's parts run one after the other
    #   (a CPU); a number: they would overlap on a GPU, the step costing its longest part + this
    tp_allreduce: Cost = 0.0             # T_AR: a tensor-parallel all-reduce, per pass and stage
    tp_overlap: bool = True              # async all-reduces overlap compute where they can
    tp_sends_wait: bool = True           # a braided step's output waits for its last all-reduce
    link: Link | None = None             # an emulated link: prices messages and all-reduces
    message_bytes: float = 0.0           # bytes of each message crossing ranks (with `link`)

    def __post_init__(self) -> None:
        if self.per not in ("microbatch", "batch"):
            raise ValueError(f"Costs.per must be 'microbatch' or 'batch', got {self.per!r}")
        self.kinds = dict(self.kinds or {})
        for name in ("F", "I", "W", "B"):
            if name == "B" and self.B is None:
                continue
            setattr(self, name, _checked(name, getattr(self, name)))
        self.comm = _checked("comm", self.comm, per_stage=False)
        self.latency = _checked("latency", self.latency, per_stage=False)
        self.parameter_bytes = _checked("parameter_bytes", self.parameter_bytes)
        if self.overlap is not None:
            self.overlap = _checked("overlap", self.overlap, per_stage=False)
        self.tp_allreduce = _checked("tp_allreduce", self.tp_allreduce)
        for name in ("tp_overlap", "tp_sends_wait"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Costs.{name} must be True or False, got {getattr(self, name)!r}")
        if not (isinstance(self.bandwidth, numbers.Real) and self.bandwidth > 0):
            raise ValueError(f"Costs.bandwidth must be a number of bytes/s > 0, got {self.bandwidth!r}")
        self.message_bytes = _checked("message_bytes", self.message_bytes, per_stage=False)
        if self.link is not None:
            check_link(self.link)
            # (dataclasses.replace runs this again: the link's own values are accepted)
            if (self.bandwidth, self.latency) not in ((math.inf, 0.0),
                                                      (self.link.bandwidth, self.link.latency)):
                raise ValueError("Costs: give link=pl.Link(...) or bandwidth/latency, not both "
                                 "(the link's are the all-reduce's)")
            self.bandwidth, self.latency = self.link.bandwidth, self.link.latency
        if self.replicas is not None and (not isinstance(self.replicas, int) or self.replicas < 1):
            raise ValueError(f"Costs.replicas must be a whole number >= 1, got {self.replicas!r}")
        for kind, value in self.kinds.items():
            self.kinds[kind] = _checked(f"kinds[{kind!r}]", value)

    @classmethod
    def from_backward(cls, F: float = 1.0, B: float = 2.0, comm: float = 0.0, **kw) -> "Costs":
        """A model given the full backward B, split evenly into I and W."""
        return cls(F=F, I=B / 2, W=B / 2, comm=comm, **kw)

    @classmethod
    def fit(cls, timeline, stages: int, comm: float = 0.0) -> "Costs":
        """The per-stage cost model a measured timeline implies: the median time of each kind on
        each stage (CPU time where it was recorded). Each kind is fitted from its own samples:
        I and W from split backwards, B from full ones; where a stage only ran full backwards,
        I and W are half of its B each. Compound steps are not split into their parts."""
        from statistics import median
        samples: dict[tuple[str, int], list[float]] = {}
        for e in timeline.events:
            if len(e.action.parts) != 1:
                continue
            took = e.cpu if e.cpu is not None else e.duration
            samples.setdefault((e.action.kind, e.action.stage), []).append(took)

        def per_stage(kind: str) -> list[float | None]:
            return [median(samples[(kind, s)]) if (kind, s) in samples else None
                    for s in range(stages)]

        forward, full, grad_in, grad_w = (per_stage(k) for k in "FBIW")
        split_in = [i if i is not None else (b / 2 if b is not None else 0.0)
                    for i, b in zip(grad_in, full)]
        split_w = [w if w is not None else (b / 2 if b is not None else 0.0)
                   for w, b in zip(grad_w, full)]
        others = {k for k, _s in samples} - set("FBIW")
        return cls(F=[f or 0.0 for f in forward], I=split_in, W=split_w, comm=comm,
                   unit=timeline.time_unit,
                   B=[b if b is not None else i + w for b, i, w in zip(full, split_in, split_w)]
                   if any(b is not None for b in full) else None,
                   kinds={k: [v or 0.0 for v in per_stage(k)] for k in sorted(others)})

    def message_time(self) -> float:
        """Seconds added to each input that crosses ranks: `comm`, plus the link's time for a
        message of `message_bytes` when there is a link."""
        return self.comm + (self.link.transfer_time(self.message_bytes) if self.link else 0.0)

    def of(self, kind: str, stage: int) -> float:
        """The cost of one `kind` action on `stage`."""
        value = getattr(self, kind) if kind in ("F", "I", "W", "B") else self.kinds.get(kind)
        if value is None:
            spec = KIND_SPECS.get(kind)
            if spec is None or spec.cost is None:
                raise ValueError(f"no cost for action kind {kind!r}: give it in the table, e.g. "
                                 f"pl.Costs(kinds={{{kind!r}: 1.0}}), or use per_action")
            return spec.cost(self, stage)
        return _at_stage(kind, value, stage)

    def of_parameter_bytes(self, stage: int) -> float:
        return _at_stage("parameter_bytes", self.parameter_bytes, stage)

    def of_tp_allreduce(self, stage: int) -> float:
        return _at_stage("tp_allreduce", self.tp_allreduce, stage)

    @property
    def tensor_parallel(self) -> bool:
        """Whether steps pay tensor-parallel all-reduces (tp_allreduce > 0 somewhere)."""
        value = self.tp_allreduce
        return any(value) if isinstance(value, list) else value > 0

    def duration(self, action, microbatches: int = 1) -> float:
        """Time of one step: an action, or a compound's parts one after the other (or, with
        `overlap` set, overlapped: the longest part plus `overlap`); with `per="batch"`, its
        share 1/`microbatches` of the batch's cost."""
        if self.per_action is not None and action in self.per_action:
            return self.per_action[action]
        share = 1.0 / microbatches if self.per == "batch" else 1.0
        times = [self.of(part[1], part[0]) * (share if _per_microbatch(part[1]) else 1.0)
                 for part in action.parts]
        if self.overlap is not None and len(times) > 1:
            return max(times) + self.overlap
        return sum(times)


def _per_microbatch(kind: str) -> bool:
    spec = KIND_SPECS.get(kind)
    return spec is None or spec.per_microbatch


def _at_stage(name: str, value, stage: int) -> float:
    """A table entry for one stage: the number itself, or the stage's item of a per-stage list."""
    if isinstance(value, list):
        if stage >= len(value):
            raise ValueError(f"Costs.{name} has {len(value)} per-stage values, "
                             f"but the schedule has stage {stage}")
        return float(value[stage])
    return float(value)


def _checked(name: str, value, per_stage: bool = True):
    """A cost as the table keeps it: a float, or a list of floats (any sequence comes in)."""
    many = per_stage and not isinstance(value, str) and hasattr(value, "__len__")
    values = list(value) if many else [value]
    if not all(_is_time(v) for v in values):
        raise ValueError(f"Costs.{name} must be a finite number >= 0"
                         f"{' (one number, or one per stage)' if per_stage else ''}, got {value!r}")
    return [float(v) for v in values] if many else value


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
    if costs.replicas is None and getattr(schedule, "data_parallel", 1) > 1:
        costs = replace(costs, replicas=schedule.data_parallel)
    names = list(KIND_SPECS)                # kinds by number, for the bulk (numpy) steps
    plain = _plain_steps(order, names)
    comm = costs.message_time()
    if costs.tensor_parallel:             # all-reduces in the steps: exposed, hidden or a tail
        took, tails, spans = _tp_timing(costs, order, schedule.microbatches)
        starts, ends = step_times(order, took, comm,
                                  tail=tails if costs.tp_sends_wait else None,
                                  data_edge=lambda step, before: data_edge(schedule, step, before))
    else:
        spans = None
        starts, ends = step_times(order, _durations(costs, order, plain, names,
                                                    schedule.microbatches), comm)
    if plain is not None:                    # one event per step, built in bulk
        rank, kind, _stage = plain
        events = list(map(_new, repeat(Event), zip(rank.tolist(), order.steps, starts, ends,
                                                   repeat(None))))
        rows = rank, kind, np.array(starts), np.array(ends)
    else:                                    # a collective's step: one event on each rank
        events = [_new(Event, (rank, item, start, end, None))
                  for ranks, item, start, end in zip(order.ranks, order.steps, starts, ends)
                  for rank in ranks]
        code = {kind: i for i, kind in enumerate(names)}
        rows = np.array([(e[0], code[part[1]], e[2], e[3]) for e in events
                         for part in e[1].parts]).reshape(-1, 4).T
    # Share of one forward's activations each kind adds (+) or releases (−): the kind specs'
    # byte rules, a split backward's halves sharing a forward's as `i_frees` says.
    effect = unit_effects(i_frees)
    stages_on = [0] * schedule.ranks
    for owner in schedule.placement:
        stages_on[owner] += 1
    # A weight replica's stage is a whole part of the model (routes.py): a rank of v stages
    # holding S parts' worth out of `stages` counts each forward as stages/S of 1/v.
    stages_on = [v * schedule.model_slices / schedule.stages for v in stages_on]
    memory = _curves(*rows, np.array([effect.get(k, 0.0) for k in names]), stages_on)
    if spans is not None:                 # the all-reduces, on the ranks' communication lanes
        events += [_new(Event, (ranks[0], Action(part[0], TP_REDUCE, part[2]), start + a,
                                start + b, None))
                   for ranks, start, step_spans in zip(order.ranks, starts, spans)
                   for a, b, part in step_spans]
    title = schedule.name + (f" (fixed batch, m={schedule.microbatches})"
                             if costs.per == "batch" else "")
    return Timeline(events, schedule.ranks, source=source, memory=memory,
                    memory_unit="microbatch-stages", title=title, time_unit=costs.unit,
                    schedule=schedule, comm=comm)


def _plain_steps(order, names: list[str]) -> tuple[np.ndarray, ...] | None:
    """(rank, kind, stage) of every step of the order as arrays (a kind as its index in
    `names`), when each step is one action on one rank; None when there are compounds or
    collectives, which are then read step by step."""
    code = {kind: i for i, kind in enumerate(names)}
    n = len(order)
    kind = np.fromiter(map(code.get, map(itemgetter(1), order.steps), repeat(-1)), np.int64, n)
    if (kind < 0).any() or max(map(len, order.ranks), default=1) > 1:
        return None                          # a compound's [1] is an action, not a kind
    rank = np.fromiter(map(itemgetter(0), order.ranks), np.int64, n)
    stage = np.fromiter(map(itemgetter(0), order.steps), np.int64, n)
    return rank, kind, stage


def _durations(costs: Costs, order, plain, names: list[str], microbatches: int) -> list[float]:
    """The time of each step of an execution order, by position: one cost per (kind, stage),
    looked up in bulk for plain steps, step by step for compounds or measured times."""
    if costs.per_action or plain is None:
        return list(map(_cached_durations(costs, microbatches), order.steps))
    _rank, kind, stage = plain
    table = np.zeros((len(names), stage.max() + 1))
    for k in np.unique(kind).tolist():
        table[k] = [costs.duration(_new(Action, (s, names[k], 0)), microbatches)
                    for s in range(table.shape[1])]
    return table[kind, stage].tolist()


def _tp_timing(costs: Costs, order, microbatches: int) -> tuple[list, list, list]:
    """Per step, by position: compute time, tail and all-reduce spans under tensor parallelism
    (tp_overlap.py), computed once per shape of step; a measured step keeps its measured time."""
    measured = costs.per_action or {}
    cache: dict = {}
    took, tails, spans = [], [], []
    for item in order.steps:
        if item in measured and not costs.link:
            took.append(measured[item])
            tails.append(0.0)
            spans.append(())
            continue
        if item in measured:          # a replay on a link: the measured compute, and the
            busy, tail, shape = step_time(costs, item, microbatches)   # link's all-reduces
            extra = measured[item] - sum(costs.duration(p, microbatches) for p in item.parts)
            took.append(busy + extra)
            tails.append(tail)
            spans.append([(a, b, item.parts[i]) for a, b, i in shape])
            continue
        key = tuple((part[0], part[1]) for part in item.parts)
        if key not in cache:
            cache[key] = step_time(costs, item, microbatches)
        busy, tail, shape = cache[key]
        took.append(busy)
        tails.append(tail)
        spans.append([(a, b, item.parts[i]) for a, b, i in shape])
    return took, tails, spans


def _cached_durations(costs: Costs, microbatches: int = 1):
    """`costs.duration`, computed once per (kind, stage) unless measured per action."""
    measured = costs.per_action or {}
    model_cost: dict[tuple[str, int], float] = {}

    def duration(action: Action) -> float:
        if measured and action in measured:
            return measured[action]
        key = (action[1], action[0]) if type(action) is Action else action
        if key not in model_cost:
            model_cost[key] = costs.duration(action, microbatches)
        return model_cost[key]
    return duration


def _curves(rank: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray,
            effect: np.ndarray, stages_on: list[int]) -> dict[int, list[tuple[float, float]]]:
    """Step curves of live activations per rank, from one row per action run (in the order
    they ran), in units of one stage's forward (a rank with v stages holds 1/v of its
    activations per stage-forward). `effect[kind]` is what a kind allocates (+, at its start)
    or frees (−, at its end). Changes at the same instant are merged (a free and an allocation
    at one moment do not dip to the lower level and back); levels are rounded to 12 digits, so
    what was allocated and freed again reads exactly 0."""
    change = effect[kind.astype(np.int64)]
    keep = change != 0
    rank, change = rank[keep], change[keep]
    when = np.where(change > 0, start[keep], end[keep])
    by_rank = np.argsort(rank, kind="stable")        # each rank's changes, still in time order
    bounds = np.searchsorted(rank[by_rank], np.arange(len(stages_on) + 1))
    curves = {}
    for r, stages in enumerate(stages_on):
        mine = by_rank[bounds[r]:bounds[r + 1]]
        t = np.concatenate(([0.0], when[mine]))
        level = np.round(np.concatenate(([0.0], np.cumsum(change[mine]))) / stages, 12)
        last = np.append(t[1:] != t[:-1], True)     # the last change at each instant
        curves[r] = list(zip(t[last].tolist(), level[last].tolist()))
    return curves
