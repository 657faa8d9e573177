"""The cost model: what one microbatch's action costs, as a table by kind.

A `Costs` describes a rank's worth of layers, as the papers' tables do: 1F1B, interleaved 1F1B
and ZB-V compare with one object, and `simulate` divides it over the stages a schedule puts on
each rank (`for_schedule`). `Costs.per_stage(...)` is the explicit table by stage index, used as
given: what a measured fit (`Costs.fit`), a partition's loads and the planner produce.
"""
from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass
from statistics import median
from typing import Mapping, Sequence

import numpy as np

from .link import Link, check_link
from .shape import shape_table
from ..schedules.actions import Action
from ..schedules.kinds import KIND_SPECS

Cost = float | Sequence[float]
_STATISTICS = {"median": median, "min": min}      # Costs.fit's reading of each kind's samples
SCOPES = ("rank", "stage")
# What a rank's worth divides over its stages: compute times and per-stage amounts of work. A
# message (comm, message_bytes), a link, an overlap constant and measured times are not divided.
_DIVIDED = ("F", "I", "W", "B", "parameter_bytes", "tp_allreduce", "activation_bytes")


@dataclass
class Costs:
    """Time of one microbatch's actions, by kind: for a rank's worth of layers, or per stage.

    `scope="rank"` (the default, `pl.Costs(...)`): the table describes one rank's worth of
    layers, as the papers' tables do, and a schedule divides it over its stages
    (`for_schedule`): a stage on a rank holding v stages costs 1/v of it — times 2 where every
    stage has a weight replica (DualPipe, Chimera: a rank's two stages are two whole parts of
    the model, each a rank's worth). So at p=4, m=8 and unit costs, 1F1B takes 33,
    interleaved 1F1B (v=2) 28.5 and ZB-V 25.5 with the same object. Each of F, I, W (and B,
    any other kind in `kinds`, `parameter_bytes` and `tp_allreduce`) is one number, or a
    sequence with one number per *rank* (a slow rank makes all its stages slow).

    `scope="stage"` (`pl.Costs.per_stage(...)`): the table is per stage index and used as
    given — one number for every stage, or one per stage. A measured fit (`Costs.fit`), a
    partition's loads (`Partition.costs()`) and the planner's tables are per stage.

    A full backward B costs I + W unless given; a compound step costs the sum of its parts; a
    kind missing from the table uses the cost rule it was registered with, or is an error
    naming it. `per_action` (measured seconds per action, as in a replay) overrides the model.

    `per="microbatch"` (the default): the table holds one microbatch's costs, so more
    microbatches mean more work. `per="batch"`: it holds the whole batch's costs and `simulate`
    charges each of the schedule's m microbatches 1/m of them — a fixed global batch, so naive
    (m=1) and GPipe (m>1) do the same work and their makespans compare. `comm` (a message's
    latency) and `per_action` (measured times) are never scaled, nor divided over stages.

    Gradient all-reduces (`AR`, data parallelism) cost a ring all-reduce of the stage's
    `parameter_bytes` (one number, or a list as F's) over `replicas` processes (default: what
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

    Tensor parallelism: `tp_allreduce` (T_AR, one number or a list as F's) is the all-reduce
    that ends each forward and each input-gradient pass (kinds registered with `tp_reduce`);
    `tp_overlap` lets it run under other compute where the step allows (tensor_overlap.py: a full
    B's W half, a braided compound's other microbatch). 0 (the default): no tensor parallelism.
    `tp_sends_wait=False` is the papers' idealisation: what a braided step sends leaves when its
    compute ends, as if its last all-reduce (the tail) were free.

    Stragglers: `slowdown={rank: factor}` makes a rank's compute `factor` times longer (a hot
    GPU, a slower node, uneven layers): every compute kind on its stages (F, I, W, B, and the
    non-collective kinds of `kinds`) is stretched, messages and collectives are not. A factor is
    a finite number >= 1; ranks are the schedule's pipeline ranks (a simulated data-parallel
    replica stands for its group: the group's all-reduce waits for its slowest member). Measured
    times (`per_action`) already carry each rank's speed, so the two are not combined.
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
    # Activation offload (kinds Off and Re): a copy of a forward's saved activations,
    # `activation_bytes` per microbatch (a rank's worth, divided as F), takes
    # activation_bytes / offload_bandwidth on the rank's copy lane. The default bandwidth is a
    # PCIe 4.0 x16 host link's ~25 GB/s one way; with no bytes given, copies are free.
    activation_bytes: Cost = 0.0
    offload_bandwidth: float = 25e9
    scope: str = "rank"                  # "rank": a rank's worth, divided over its stages;
    #   "stage": one stage's costs, by stage index, as given (Costs.per_stage)
    slowdown: Mapping[int, float] | None = None   # {pipeline rank: factor >= 1}: a straggler

    def __post_init__(self) -> None:
        if self.per not in ("microbatch", "batch"):
            raise ValueError(f"Costs.per must be 'microbatch' or 'batch', got {self.per!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"Costs.scope must be 'rank' (a rank's worth of layers, divided over "
                             f"its stages) or 'stage' (per stage index), got {self.scope!r}")
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
        self.activation_bytes = _checked("activation_bytes", self.activation_bytes)
        bw = self.offload_bandwidth
        if isinstance(bw, bool) or not (isinstance(bw, numbers.Real) and bw > 0):
            raise ValueError(f"Costs.offload_bandwidth must be a number of bytes per time unit "
                             f"> 0, got {self.offload_bandwidth!r}")
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
        self.slowdown = check_slowdown(self.slowdown, "Costs.slowdown") or None
        if self.slowdown and self.per_action is not None:
            raise ValueError("Costs.slowdown with per_action: measured times already carry each "
                             "rank's speed; give one or the other")

    @classmethod
    def per_stage(cls, **table) -> "Costs":
        """An explicit table by stage index, used as given: each cost is one number for every
        stage or a list with one per stage (`scope="stage"`)."""
        if "scope" in table:
            raise ValueError("Costs.per_stage sets scope='stage' itself; do not pass scope")
        return cls(scope="stage", **table)

    def for_schedule(self, schedule) -> "Costs":
        """This table as `schedule`'s stages cost, a per-stage table (what `simulate` runs on).

        A per-stage table comes back as it is, once its lists are checked against the
        schedule's stages. A rank's worth is divided: stage s on a rank holding v stages costs
        `copies`/v of its rank's value, `copies` being 2 where every stage is a weight replica
        (stages = 2 × model parts: DualPipe, Chimera), else 1."""
        if self.slowdown:
            return self._slowed(schedule)
        stages, ranks = schedule.stages, schedule.ranks
        lists = {name: value for name, value in self._tables() if isinstance(value, list)}
        if self.scope == "stage":
            for name, value in lists.items():
                if len(value) != stages:
                    raise ValueError(f"Costs.{name} has {len(value)} values; a per-stage table "
                                     f"(Costs.per_stage) needs one number, or one per stage "
                                     f"({stages} in {schedule.name})")
            return self
        for name, value in lists.items():
            if len(value) != ranks:
                raise ValueError(f"Costs.{name} has {len(value)} values; a rank's worth (pl.Costs) "
                                 f"needs one number, or one per rank ({ranks}); for one per "
                                 f"stage use pl.Costs.per_stage(...)")
        copies = stages / schedule.model_slices
        held = [0] * ranks
        for owner in schedule.placement:
            held[owner] += 1
        rank_of = schedule.placement
        share = [copies / held[rank_of[s]] for s in range(stages)]
        if not lists and all(x == 1.0 for x in share):
            return self._as_stage({})                # one stage per rank: nothing to divide

        def divided(value):
            if isinstance(value, list):
                return [value[rank_of[s]] * share[s] for s in range(stages)]
            if all(x == share[0] for x in share):
                return value * share[0]
            return [value * x for x in share]

        changed = {name: divided(getattr(self, name)) for name in _DIVIDED
                   if getattr(self, name) is not None}
        changed["kinds"] = {kind: divided(value) for kind, value in self.kinds.items()}
        return self._as_stage(changed)

    def _slowed(self, schedule) -> "Costs":
        """`for_schedule` of this table without its slowdown, then each slow rank's stages'
        compute costs multiplied by the rank's factor (a per-stage table, slowdown applied)."""
        late = [r for r in self.slowdown if r >= schedule.ranks]
        if late:
            raise ValueError(f"Costs.slowdown names rank {late[0]}, but schedule "
                             f"{schedule.name!r} has ranks 0..{schedule.ranks - 1}")
        plain = copy.copy(self)
        plain.slowdown = None
        table = plain.for_schedule(schedule)
        factor = [self.slowdown.get(schedule.rank_of(s), 1.0) for s in range(schedule.stages)]

        def stretched(value):
            values = value if isinstance(value, list) else [value] * len(factor)
            return [float(v) * f for v, f in zip(values, factor)]

        changed = {name: stretched(getattr(table, name)) for name in ("F", "I", "W", "B")
                   if getattr(table, name) is not None}
        changed["kinds"] = {kind: stretched(value) if _computes(kind) else value
                            for kind, value in table.kinds.items()}
        return table._as_stage(changed)

    def _as_stage(self, changed: dict) -> "Costs":
        """A per-stage copy with `changed` values: checked values divided stay valid, so the
        copy skips __post_init__ (simulate calls this on every run)."""
        out = copy.copy(self)
        for name, value in {**changed, "scope": "stage"}.items():
            setattr(out, name, value)
        return out

    def _tables(self):
        """(name, value) of every cost that a schedule's stages divide."""
        for name in _DIVIDED:
            if getattr(self, name) is not None:
                yield name, getattr(self, name)
        for kind, value in self.kinds.items():
            yield f"kinds[{kind!r}]", value

    @classmethod
    def from_shape(cls, hidden: int, layers: int, heads: int, seq_len: int, vocab: int,
                   microbatch: int, stages: int, **options) -> "Costs":
        """The per-stage table of a GPT of this shape on a `device` (sim/shape.py's
        `shape_table`: its options, formulas and bytes)."""
        return cls.per_stage(**shape_table(hidden, layers, heads, seq_len, vocab, microbatch,
                                           stages, **options))

    @classmethod
    def from_backward(cls, F: float = 1.0, B: float = 2.0, comm: float = 0.0, **kw) -> "Costs":
        """A model given the full backward B, split evenly into I and W."""
        return cls(F=F, I=B / 2, W=B / 2, comm=comm, **kw)

    @classmethod
    def fit(cls, timeline, stages: int | None = None, comm: float | None = None,
            statistic: str = "median") -> "Costs":
        """The per-stage table (`scope="stage"`) a measured timeline implies: the median time
        of each kind on each stage (CPU time where it was recorded). `statistic="min"` takes
        the shortest instead: for wall-clock spans on a shared machine (a profiler trace holds
        no CPU time), where other processes only ever lengthen a span. Each kind is fitted from
        its own samples: I and W from split backwards, B from full ones; where a stage only ran
        full backwards, I and W are half of its B each. A compound step of one pass on several
        microbatches (Chimera's doubled forward `0F0+0F1`) counts as that many passes, each an
        equal share of its time; one that joins different passes (DualPipe's F&B pair) is left
        out: no one kind's time can be read from it. Given a RunResult instead, its measured
        timeline, its schedule's stages and its measured message latency."""
        if hasattr(timeline, "timeline") and hasattr(timeline, "spec"):     # a RunResult
            res = timeline
            timeline, stages = res.timeline, res.schedule.stages if stages is None else stages
            comm = res.comm_latency if comm is None else comm
        if stages is None:
            raise ValueError("Costs.fit(timeline, stages): give the schedule's stages, or pass "
                             "the RunResult itself (Costs.fit(res))")
        comm = 0.0 if comm is None else comm
        pick = _STATISTICS.get(statistic)
        if pick is None:
            raise ValueError(f"statistic must be one of {', '.join(map(repr, _STATISTICS))}, "
                             f"got {statistic!r}")
        samples: dict[tuple[str, int], list[float]] = {}
        for e in timeline.events:
            parts = e.action.parts
            if len({(a.kind, a.stage) for a in parts}) != 1:
                continue
            took = (e.cpu if e.cpu is not None else e.duration) / len(parts)
            samples.setdefault((parts[0].kind, parts[0].stage), []).extend([took] * len(parts))

        def per_stage(kind: str) -> list[float | None]:
            return [pick(samples[(kind, s)]) if (kind, s) in samples else None
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
                   kinds={k: [v or 0.0 for v in per_stage(k)] for k in sorted(others)},
                   scope="stage")

    def message_time(self) -> float:
        """Seconds added to each input that crosses ranks: `comm`, plus the link's time for a
        message of `message_bytes` when there is a link."""
        return self.comm + (self.link.transfer_time(self.message_bytes) if self.link else 0.0)

    def of(self, kind: str, stage: int) -> float:
        """The cost of one `kind` action at index `stage` of the table as it stands (a
        per-stage table's stage; a rank's worth's rank): `for_schedule(...).of` for a stage."""
        value = getattr(self, kind) if kind in ("F", "I", "W", "B") else self.kinds.get(kind)
        if value is None:
            spec = KIND_SPECS.get(kind)
            if spec is None or spec.cost is None:
                raise ValueError(f"no cost for action kind {kind!r}: give it in the table, e.g. "
                                 f"pl.Costs(kinds={{{kind!r}: 1.0}}), or use per_action")
            return spec.cost(self, stage)
        return _at_stage(kind, value, stage)

    def of_stages(self, kind: str, stages: int) -> np.ndarray:
        """`of(kind, s)` for every stage s < `stages` at once (the same numbers, as an array)."""
        value = getattr(self, kind) if kind in ("F", "I", "W", "B") else self.kinds.get(kind)
        if value is None:                  # costed by its kind's spec: over arrays if it can
            spec = KIND_SPECS.get(kind)
            if spec is not None and spec.stage_costs is not None:
                out = np.asarray(spec.stage_costs(self, stages), float)
                return np.full(stages, out) if out.ndim == 0 else out   # (a constant rule)
            return np.array([self.of(kind, s) for s in range(stages)], float)
        return _stage_array(kind, value, stages)

    def field_stages(self, name: str, stages: int) -> np.ndarray:
        """A per-stage field (`tp_allreduce`, `parameter_bytes`, `activation_bytes`) for every
        stage s < `stages` at once: what `of_tp_allreduce(s)` and the like read."""
        return _stage_array(name, getattr(self, name), stages)

    def of_parameter_bytes(self, stage: int) -> float:
        return _at_stage("parameter_bytes", self.parameter_bytes, stage)

    def offload_time(self, stage: int) -> float:
        """One offload or reload copy of a stage's activations: activation_bytes / bandwidth."""
        return _at_stage("activation_bytes", self.activation_bytes, stage) / self.offload_bandwidth

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


def check_slowdown(value, name: str = "slowdown") -> dict[int, float]:
    """`value` as {rank: factor} if it is a mapping of ranks (whole numbers >= 0) to finite
    factors >= 1 (None: no straggler, {}); else ValueError naming `name` and the rule."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict {{rank: factor}}, e.g. {{1: 1.1}} for rank 1 "
                         f"10% slower, got {value!r}")
    out = {}
    for rank, factor in value.items():
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
            raise ValueError(f"{name}: each key is a rank (a whole number >= 0), got {rank!r}")
        if not _is_time(factor) or factor < 1:
            raise ValueError(f"{name}[{rank}] must be a finite factor >= 1 (1.1: 10% slower), "
                             f"got {factor!r}")
        out[int(rank)] = float(factor)
    return out


def _computes(kind: str) -> bool:
    """Whether a kind is a rank's own computation (what a slower rank takes longer over): on the
    compute lane and not a collective (a collective waits for its slowest member instead)."""
    spec = KIND_SPECS.get(kind)
    return spec is None or (spec.lane == "compute" and not spec.collective)


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


def _stage_array(name: str, value, stages: int) -> np.ndarray:
    """`_at_stage` for stages 0 … stages − 1 at once."""
    if isinstance(value, list):
        if stages > len(value):
            _at_stage(name, value, stages - 1)          # raises, saying which stage is missing
        return np.array(value[:stages], float)
    return np.full(stages, float(value))


def _checked(name: str, value, per_stage: bool = True):
    """A cost as the table keeps it: a float, or a list of floats (any sequence comes in)."""
    many = per_stage and not isinstance(value, str) and hasattr(value, "__len__")
    values = list(value) if many else [value]
    # The common case at once (a planner builds thousands of tables): plain floats with a
    # finite sum (so no NaN, no infinity, and `min` is the true least) and none below 0.
    # Anything else (ints, numpy numbers, bad values) is judged one by one below.
    if many and set(map(type, values)) <= {float} and math.isfinite(sum(values)) \
            and min(values, default=0.0) >= 0.0:
        return values
    if not all(_is_time(v) for v in values):
        raise ValueError(f"Costs.{name} must be a finite number >= 0"
                         f"{' (one number, or one per stage)' if per_stage else ''}, got {value!r}")
    return [float(v) for v in values] if many else value


def _is_time(value) -> bool:
    """A finite, non-negative real number (NaN would silently poison every later start time)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0
