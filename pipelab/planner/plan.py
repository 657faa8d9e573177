"""The planner: which schedule, mesh, microbatching and recomputation for a model on N devices?

    cal = pl.calibrate(cfg)                                     # measured per-layer costs
    best = pl.plan(cfg, devices=8, memory_per_device=256 * 2**20, calibration=cal).best
    pl.plan(pl.ModelShape(4096, 32, 32, 4096, 32_000), devices=16, memory_per_device=80e9,
            device=pl.Device.named("A100-80GB")).best           # a real model's shape

`plan` enumerates schedule × pipeline, data, tensor and expert degrees × microbatches × chunks ×
recomputation policy × vocabulary parallelism (the `vocab-1`/`vocab-2` schedules, and
`v-half-vocab` for a shape: the embedding and output layer sharded over the pipeline ranks),
predicts each candidate's step time with the simulator (one simulation per candidate) and its
peak memory per rank in bytes with a byte model read along the simulated timeline, and ranks
them by time.

Where the costs and bytes come from is the plan's source, the one thing that differs between
the two kinds of model (the search, the prediction and the ranking are this module's alone):

- a `pl.ModelConfig` (calibrated.py): costs from a CPU calibration (costs.py), bytes from the
  toy model's byte model (memory.action_bytes, static_bytes); a policy's recomputations are `R`
  actions placed by `with_recompute`, as the runtime places them;
- a `pl.CustomModel` (custom_source.py): costs and bytes of each of its layers, measured by
  `calibrate` (calibrate_custom.py); pipeline and data parallelism only;
- a `pl.ModelShape` on a `pl.Device` (shaped.py): costs and bytes from closed forms
  (sim/shape.py: FLOPs at the device's speed, Korthikanti's activation bytes per policy, 18
  bytes a parameter for mixed-precision Adam); tp within a node (`gpus_per_node`).

The mesh axes are pipeline (p), data (dp) and tensor (tp) with p × dp × tp = devices (mesh.py).
For a config, tp divides the heads and the MLP's hidden width, and runs without recomputation
(as the runtime does). A tensor shard computes its share of each block and pays two
all-reduces a block per forward and input-gradient pass (`Costs.tp_allreduce`); its bytes are
memory.py's with `tensor=t`. Vocabulary parallelism shards over the pipeline ranks (for a
config dp = tp = 1, as the runtime runs it): its passes are costed from the calibrated head and
embedding layers divided over the shards, its bytes come from memory.py (`vocab_bytes`,
`static_bytes`). Expert parallelism (a mixture-of-experts config) divides the experts over the
replicas (ep = dp, where it divides them): two all-to-alls per block per pass, E/ep experts'
bytes, activations bounded by the experts' capacity (memory_moe.py).
"""
from __future__ import annotations

from functools import lru_cache
from itertools import product, repeat
from operator import itemgetter

import numpy as np

from .calibrate import Calibration, calibrate
from .calibrate_custom import CustomCalibration
from .custom_source import CustomPlanned
from ..model.custom import CustomModel
from ..checks import at_most, names, positive_int, positive_ints
from ..model.gpt import ModelConfig
from ..techniques import with_data_parallel
from .calibrated import POLICIES, SCHEDULE_NAMES, UNPLANNABLE, CalibratedModel  # noqa: F401
from .candidate import CHUNKED, FIXED_CHUNKS, GB, MiB, VOCAB, Candidate  # noqa: F401
from .mesh import divisors
from .shaped import GPUS_PER_NODE, ShapedModel
from ..techniques.recompute import with_recompute
from ..schedules import SCHEDULES, Action, schedule as make_schedule
from ..schedules.gcpause import without_gc
from ..schedules.kinds import byte_rules
from ..sim.device import Device
from ..sim.shape import ModelShape
from ..sim.simulate import simulate

# The split of each candidate is an exact dynamic program, O(stages × layers²): beyond this
# many layers (4 × the deepest published transformers) a sweep would run for minutes.
MAX_PLAN_LAYERS = 512
MAX_DEVICES = 2**20
MAX_BATCH = 2**24


class Plan(list):
    """Candidates ranked by predicted step time (fastest first), fitting or not."""

    def __init__(self, candidates, source, devices: int, budget: float, batch_size: int):
        super().__init__(sorted(candidates, key=lambda c: (c.step_time, c.peak_memory)))
        self.source = source
        self.calibration = getattr(source, "calibration", None)     # a config's plan
        self.cfg = getattr(source, "cfg", None)
        self.shape = getattr(source, "shape", None)                  # a shape's plan
        self.device = getattr(source, "device", None)
        self.devices, self.budget, self.batch_size = devices, budget, batch_size

    def timeline(self, candidate: Candidate):
        """The simulated step the prediction read (with its all-reduces)."""
        sched = _runnable(candidate, self.source)
        return simulate(sched, self.source.model(candidate, sched)[0])

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self if c.fits]

    @property
    def best(self) -> Candidate:
        """The fastest candidate that fits; ValueError saying what would be needed if none."""
        fitting = self.fitting
        if not fitting:
            raise ValueError(self.nothing_fits())
        return fitting[0]

    def _size(self, nbytes: float) -> str:
        name, size = self.source.unit
        return f"{nbytes / size:.1f} {name}"

    def nothing_fits(self) -> str:
        smallest = min(self, key=lambda c: c.peak_memory)
        return (f"nothing fits in memory_per_device={self._size(self.budget)} on "
                f"{self.devices} device(s): the smallest predicted peak is "
                f"{self._size(smallest.peak_memory)} ({smallest.label()}); give each device "
                f"at least that much, or more devices")

    def frontier(self) -> list[Candidate]:
        """The Pareto frontier of (step time, peak memory): no other candidate is at least as
        fast and as small and better in one. By increasing memory."""
        out: list[Candidate] = []
        for c in sorted(self, key=lambda c: (c.peak_memory, c.step_time)):
            if not out or c.step_time < out[-1].step_time:
                out.append(c)
        return out

    def explain(self) -> str:
        """One sentence on the choice: what it is, and what memory ruled out, if anything."""
        if not self.fitting:
            return self.nothing_fits()
        best, fastest = self.best, self[0]
        name, size = self.source.unit
        head = (f"{best.label()} is predicted fastest of the {len(self.fitting)} of {len(self)} "
                f"candidates that fit ({best.step_time * 1e3:.2f} ms per step, peak "
                f"{best.peak_memory / size:.1f} of {self.budget / size:.1f} {name} per device)")
        if fastest is best:
            return head + "; memory does not bind: it is the fastest of all."
        return head + (f"; the faster {fastest.label()} ({fastest.step_time * 1e3:.2f} ms) "
                       f"does not fit: {fastest.reason}.")

    def table(self, rows: int = 12) -> str:
        name, size = self.source.unit
        lines = [f"{'rank':>4}  {'candidate':<52} {'ms/step':>8} {'peak ' + name:>9}  fits",
                 *(f"{i:>4}  {c.label():<52} {c.step_time * 1e3:8.2f} "
                   f"{c.peak_memory / size:9.2f}  {'yes' if c.fits else 'no'}"
                   for i, c in enumerate(self[:rows]))]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Plan({len(self)} candidates, {len(self.fitting)} fit)"

    __str__ = table


@without_gc       # ~10^6 short-lived tuples per sweep, no cycles: collecting them is waste
def plan(model: ModelConfig | ModelShape | CustomModel, devices: int, memory_per_device: float,
         *, batch_size: int | None = None,
         calibration: Calibration | CustomCalibration | None = None,
         device: Device | None = None, gpus_per_node: int = GPUS_PER_NODE,
         schedules=None, recompute=None, chunks=(2,), microbatches=None,
         optimizer: str = "adamw") -> Plan:
    """Every candidate for training `model` on `devices` with `memory_per_device` bytes each,
    predicted and ranked by step time. `model`: a `pl.ModelConfig` or a `pl.CustomModel`
    (costs from `calibration`, measured here if not given) or a `pl.ModelShape` (costs from `device`, an A100-80GB unless
    given; tensor parallelism within `gpus_per_node`). `batch_size` sequences per step
    (default 8 per device); `microbatches`: the counts to try (default every divisor of a
    replica's batch); `chunks`: stages per rank for the schedules that interleave; `schedules`
    and `recompute` default to every one the model's source plans."""
    kind = _kind(model, calibration, device, gpus_per_node, optimizer)
    schedules, recompute, chunks, microbatches = _check(
        kind, devices, memory_per_device, schedules, recompute, chunks, microbatches)
    batch_size = 8 * devices if batch_size is None else at_most(
        "batch_size", positive_int("batch_size", batch_size), MAX_BATCH,
        "the planner tries every divisor of a replica's batch")
    if kind is CalibratedModel:     # measured only once every argument is known to be good
        cal = calibration if calibration is not None else calibrate(model)
        if cal.cfg != model:
            raise ValueError("calibration was measured for another model config: "
                             "calibrate(cfg) again")
        source = CalibratedModel(cal, optimizer)
    elif kind is CustomPlanned:
        cal = calibration if calibration is not None else calibrate(model)
        if not isinstance(cal, CustomCalibration) or repr(cal.model) != repr(model):
            raise ValueError("calibration was measured for another model: calibrate(model) "
                             "again with this pl.CustomModel")
        source = CustomPlanned(cal, optimizer)
    else:
        source = ShapedModel(model, Device.named("A100-80GB") if device is None else device,
                             gpus_per_node)
    out, mesh = [], list(source.meshes(devices, batch_size))
    if not mesh:
        raise ValueError(f"no candidate: with batch_size={batch_size}, devices={devices} cannot "
                         f"be factored as pipeline × data × tensor: p must be at most "
                         f"{source.max_stages(False)} (one layer a stage), dp must divide "
                         f"batch_size, tp must {source.tensor_rule}; try a batch_size that "
                         f"more device counts divide, or another number of devices")
    for p, dp, tp, ep in mesh:
        per_replica = batch_size // dp
        tried = microbatches if microbatches is not None else divisors(per_replica)
        counts = [m for m in tried if per_replica % m == 0]
        for name, m in product(schedules, counts):
            vocab = name in VOCAB
            for v in (chunks if name in CHUNKED else (FIXED_CHUNKS.get(name, 1),)):
                if p * v > source.max_stages(vocab) or (v > 1 and p == 1):
                    continue                     # interleaving needs a pipeline to interleave
                if vocab and not source.shards_vocabulary(p, dp, tp):
                    continue                     # shards over 2+ ranks (config: no dp, tp)
                sched = _schedule(name, p, m, v, dp)
                if sched is None:
                    continue                     # the schedule does not exist at this size
                bounds = source.bounds(p * v, per_replica // m, vocab)
                again = None                     # the schedule with its recomputations R
                for policy in source.policies(recompute, tp):
                    c = Candidate(name, p, dp, m, v, policy, per_replica // m, bounds, tp, ep)
                    run = sched
                    if policy != "none" and source.recompute_actions:
                        if again is None:
                            again = with_recompute(sched).validate()
                        run = again
                    _predict(c, run, source)
                    c.fits = c.peak_memory <= memory_per_device
                    c.reason = "" if c.fits else _why_not(c, memory_per_device, source.unit)
                    out.append(c)
    if not out:
        asked = "" if microbatches is None else (
            f" and microbatches={list(microbatches)} (each must divide a replica's "
            f"batch_size / data-parallel degree)")
        raise ValueError(f"no candidate: with batch_size={batch_size}, devices={devices}{asked} "
                         f"no schedule of {list(schedules)} can be built")
    return Plan(out, source, devices, memory_per_device, batch_size)


def _splittable(what: str, layers: int) -> None:
    """Refuse a model too deep for the exact split every candidate gets."""
    at_most(what, layers, MAX_PLAN_LAYERS,
            "the planner splits every candidate exactly, in O(stages × layers²)")


def _kind(model, calibration, device, gpus_per_node, optimizer) -> type:
    """The source of costs and bytes `model` plans with (see the module's docstring), its
    arguments checked."""
    if isinstance(model, ModelConfig):
        if device is not None:
            raise ValueError("device is for a pl.ModelShape's plan; a pl.ModelConfig's costs "
                             "come from its calibration")
        _splittable("the model's layers (n_layers + 2)", model.total_layers)
        return CalibratedModel
    if isinstance(model, CustomModel):
        if device is not None:
            raise ValueError("device is for a pl.ModelShape's plan; a pl.CustomModel's costs "
                             "come from its calibration (pl.calibrate(model))")
        _splittable("the model's layers", model.total_layers)
        if optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        return CustomPlanned
    if isinstance(model, ModelShape):
        if calibration is not None:
            raise ValueError("calibration is for a pl.ModelConfig's plan; a pl.ModelShape's "
                             "costs come from its device (device=pl.Device.named(...))")
        _splittable("the model's layers (layers + 2)", model.layers + 2)
        if device is not None and not isinstance(device, Device):
            raise ValueError(f"device must be a pl.Device (e.g. pl.Device.named('A100-80GB')), "
                             f"got {type(device).__name__}")
        positive_int("gpus_per_node", gpus_per_node)
        if optimizer != "adamw":
            raise ValueError(f"optimizer: a pl.ModelShape's bytes are mixed-precision Adam's "
                             f"(18 bytes a parameter, sim/shape.py); only 'adamw', got "
                             f"{optimizer!r}")
        return ShapedModel
    raise ValueError(f"model must be a pl.ModelConfig or a pl.ModelShape (or a "
                     f"pl.CustomModel), got {type(model).__name__}")


def _check(source, devices, memory_per_device, schedules, recompute, chunks, microbatches):
    """The arguments, checked and normalised: (schedules, recompute, chunks, microbatches)."""
    at_most("devices", positive_int("devices", devices), MAX_DEVICES,
            "the planner enumerates every divisor of it")
    schedules = source.schedules if schedules is None else names(
        "schedules", schedules, "['1f1b', 'zb-h1']")
    recompute = source.policy_names if recompute is None else names(
        "recompute", recompute, "['none', 'full']")
    chunks = positive_ints("chunks", chunks, "(2,) for two stages per rank")
    if microbatches is not None:       # None: every divisor of a replica's batch
        microbatches = positive_ints("microbatches", microbatches, "(4, 8)")
    if isinstance(memory_per_device, bool) or not isinstance(memory_per_device, (int, float)) \
            or not memory_per_device > 0:
        raise ValueError(f"memory_per_device must be a number of bytes > 0, got {memory_per_device!r}")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        raise ValueError(f"schedules: unknown {unknown}; known: {', '.join(SCHEDULES)}")
    if source is CalibratedModel:
        refused = [s for s in schedules if s in UNPLANNABLE]
        if refused:
            raise ValueError(f"schedules: {refused[0]} cannot be planned for a pl.ModelConfig: "
                             f"{UNPLANNABLE[refused[0]]}")
    if source is CustomPlanned:
        refused = [s for s in schedules if s not in source.schedules]
        if refused:
            raise ValueError(f"schedules: {refused[0]} cannot be planned for a pl.CustomModel: "
                             f"its planner source costs the schedules of forwards and backwards "
                             f"{', '.join(source.schedules)}")
        if "selective" in recompute:
            raise ValueError("recompute: 'selective' drops the GPT's attention core, which a "
                             "pl.CustomModel does not have; plan 'none' or 'full'")
    bad = [r for r in recompute if r not in source.policy_names]
    if bad:
        raise ValueError(f"recompute: policies must be among {source.policy_names}, got {bad}")
    return schedules, recompute, chunks, microbatches


def _schedule(name: str, p: int, m: int, v: int, dp: int):
    """The validated schedule with its all-reduces, or None where the family has no member
    of this shape (e.g. too few microbatches)."""
    return _validated(SCHEDULES[name], name, p, m, v, dp)


# Schedules are pure functions of their arguments, and building and validating the big ones
# (V-Half's squeeze, the vocabulary passes' weave) costs more than simulating them: a plan and
# its variations (another device, another budget) share them. Keyed on the generator, so a
# name registered anew builds afresh; bounded, as one plan of 16 devices builds ~200.
@lru_cache(maxsize=512)
def _validated(generator, name: str, p: int, m: int, v: int, dp: int):
    base = _built(generator, name, p, m, v)
    try:
        return None if base is None else with_data_parallel(base, dp).validate()
    except ValueError:
        return None


@lru_cache(maxsize=256)
def _built(generator, name: str, p: int, m: int, v: int):
    try:
        return make_schedule(name, ranks=p, microbatches=m,
                             **({"chunks": v} if name in CHUNKED else {}))
    except ValueError:
        return None


def _runnable(c: Candidate, source):
    """The candidate's schedule as the prediction simulates it: its all-reduces, and its
    recomputations where the source places them as actions."""
    sched = with_data_parallel(c.build(), c.data_parallel)
    if c.recompute != "none" and source.recompute_actions:
        sched = with_recompute(sched)
    return sched


def _predict(c: Candidate, sched, source) -> None:
    costs, c.static, table = source.model(c, sched)
    tl = simulate(sched, costs)
    c.step_time = tl.makespan
    # Each kind's bytes are those of its spec's byte rule.
    c.activation_peak = activation_peaks(tl, {kind: tuple(np.array(table[rule]).T)
                                              for kind, rule in byte_rules().items()
                                              if rule in table})
    c.memory_by_rank = [s + a for s, a in zip(c.static, c.activation_peak)]


def activation_peaks(timeline, table: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[int]:
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
    rank, level = rank[sort], np.cumsum(delta[sort])
    peaks = [0] * timeline.ranks
    bounds = np.searchsorted(rank, np.arange(timeline.ranks + 1))
    for r in range(timeline.ranks):
        a, b = bounds[r], bounds[r + 1]
        if b > a:                        # the level before this rank's first change is a's
            peaks[r] = int(max(0, (level[a:b] - (level[a - 1] if a else 0)).max()))
    return peaks


def _why_not(c: Candidate, budget: float, unit: tuple[str, float]) -> str:
    r, (name, size) = int(np.argmax(c.memory_by_rank)), unit
    return (f"rank {r} would hold {c.memory_by_rank[r] / size:.1f} {name} > "
            f"{budget / size:.1f} {name} ({c.activation_peak[r] / size:.1f} {name} of "
            f"activations, {c.static[r] / size:.1f} {name} of parameters, gradients and "
            f"optimizer state)")
