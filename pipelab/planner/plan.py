"""The planner: which schedule, mesh, microbatching and recomputation for a model on N devices?

    cal = pl.calibrate(cfg)                                     # measured per-layer costs
    best = pl.plan(cfg, devices=8, memory_per_device=256 * 2**20, calibration=cal).best
    pl.plan(pl.ModelShape(4096, 32, 32, 4096, 32_000), devices=16, memory_per_device=80e9,
            device=pl.Device.named("A100-80GB")).best           # a real model's shape

`plan` enumerates schedule × pipeline, data, tensor and expert degrees × microbatches × chunks ×
recomputation policy × vocabulary parallelism (the `vocab-1`/`vocab-2` schedules, and
`v-half-vocab` for a shape: the embedding and output layer sharded over the pipeline ranks),
predicts each candidate's step time with the simulator and its peak memory per rank in bytes
with a byte model, and ranks them by time. The memory of every candidate is read along its
ranks' program order (peaks.py: what the timeline would say, with no timeline); the step
times are simulated best-first by a closed-form lower bound (bound.py), until no bound can
beat the best candidate that fits; the rest when something reads them (ranked.py). With
`prune=False` every candidate is simulated and its memory read along its timeline.

Where the costs and bytes come from is the plan's source, the one thing that differs between
the two kinds of model (the search, the prediction and the ranking are this module's alone):

- a `pl.ModelConfig` (calibrated.py): costs from a CPU calibration (costs.py), bytes from the
  toy model's byte model (memory.action_bytes, static_bytes); a policy's recomputations are `R`
  actions placed by `with_recompute`, as the runtime places them;
- a `pl.CustomModel` (custom_source.py): costs and bytes of each of its layers, measured by
  `calibrate` (calibrate_custom.py); pipeline and data parallelism only;
- a `pl.ModelShape` on a `pl.Device` (shaped.py): costs and bytes from closed forms
  (sim/shape.py: FLOPs at the device's speed, Korthikanti's activation bytes per policy, 18
  bytes a parameter for mixed-precision Adam, or 6 + 12/dp with `optimizer="zero-1"`, the
  distributed optimizer); tp within a node (`gpus_per_node`), the pipeline's messages and the
  data-parallel rings that leave a node on the device's inter-node link.

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

from functools import lru_cache, partial
from itertools import product

import numpy as np

from .calibrate import Calibration, calibrate
from .calibrate_custom import CustomCalibration
from .custom_source import CustomPlanned
from ..model.custom import CustomModel
from ..checks import at_most, names, positive_int, positive_ints
from ..model.gpt import ModelConfig
from ..techniques import with_data_parallel
from .bound import chain_costs, time_bound
from .calibrated import POLICIES, SCHEDULE_NAMES, UNPLANNABLE, CalibratedModel  # noqa: F401
from .candidate import CHUNKED, FIXED_CHUNKS, GB, MiB, VOCAB, Candidate  # noqa: F401
from .mesh import divisors
from .peaks import activation_peaks, kind_table, order_peaks, stacked
from .ranked import Plan, runnable as _runnable
from .rows import rows_of, with_recompute_rows
from .shaped import GPUS_PER_NODE, ShapedModel
from ..techniques.recompute import with_recompute
from ..schedules import SCHEDULES
from ..schedules.gcpause import without_gc
from ..schedules.registry import build as build_schedule
from ..sim.device import Device
from ..sim.shape import OPTIMIZERS as SHAPE_OPTIMIZERS, ModelShape
from ..sim.simulate import simulate

# The split of each candidate is an exact dynamic program, O(stages × layers²): beyond this
# many layers (4 × the deepest published transformers) a sweep would run for minutes.
MAX_PLAN_LAYERS = 512
MAX_DEVICES = 2**20
MAX_BATCH = 2**24


@without_gc       # ~10^6 short-lived tuples per sweep, no cycles: collecting them is waste
def plan(model: ModelConfig | ModelShape | CustomModel, devices: int, memory_per_device: float,
         *, batch_size: int | None = None,
         calibration: Calibration | CustomCalibration | None = None,
         device: Device | None = None, gpus_per_node: int = GPUS_PER_NODE,
         schedules=None, recompute=None, chunks=(2,), microbatches=None,
         optimizer: str = "adamw", prune: bool = True,
         memory_headroom: float = 0.0) -> Plan:
    """Every candidate for training `model` on `devices` with `memory_per_device` bytes each,
    predicted and ranked by step time. `model`: a `pl.ModelConfig` or a `pl.CustomModel`
    (costs from `calibration`, measured here if not given) or a `pl.ModelShape` (costs from `device`, an A100-80GB unless
    given; tensor parallelism within `gpus_per_node`). `batch_size` sequences per step
    (default 8 per device); `microbatches`: the counts to try (default every divisor of a
    replica's batch); `chunks`: stages per rank for the schedules that interleave; `schedules`
    and `recompute` default to every one the model's source plans.

    `prune` (default True): simulate only the candidates that could be the best. Every
    candidate's peak memory is computed (it does not need a timeline); the step times are
    simulated best-first by a lower bound (bound.py), and the search stops at the first bound
    above the best fitting time found: no other candidate can beat it. The others are simulated
    when read (`Candidate.step_time`, `Plan.table`, `frontier`, iteration); what the plan
    says is the exhaustive search's, to the bit. `prune=False`: simulate every candidate at
    once, reading its memory along its timeline (the reference the tests compare with).

    `optimizer`: "adamw" (every replica keeps Adam's state) or, for a `pl.ModelShape`,
    "zero-1" (the distributed optimizer: the state sharded over the dp replicas);
    "sgd" for a config or a custom model. `memory_headroom` (0 ≤ h < 1): the share of each
    device's memory kept free for what the byte model does not count (the allocator's
    fragmentation, the framework's workspace, NCCL's buffers): a candidate fits when its peak
    is at most (1 − h) × memory_per_device."""
    if not isinstance(prune, bool):
        raise ValueError(f"prune must be True (simulate only what could be best) or False "
                         f"(simulate every candidate), got {prune!r}")
    positive_int("gpus_per_node", gpus_per_node)
    kind = _kind(model, calibration, device, gpus_per_node, optimizer)
    if isinstance(memory_headroom, bool) or not isinstance(memory_headroom, (int, float)) \
            or not 0 <= memory_headroom < 1:
        raise ValueError(f"memory_headroom must be a share of memory_per_device kept free, "
                         f"0 <= memory_headroom < 1 (e.g. 0.1), got {memory_headroom!r}")
    schedules, recompute, chunks, microbatches = _check(
        kind, devices, memory_per_device, schedules, recompute, chunks, microbatches)
    batch_size = 8 * devices if batch_size is None else at_most(
        "batch_size", positive_int("batch_size", batch_size), MAX_BATCH,
        "the planner tries every divisor of a replica's batch")
    if kind is not ShapedModel and calibration is not None \
            and not isinstance(calibration, (Calibration, CustomCalibration)):
        # after the shape's and the schedules' own refusals, which name the better fix
        raise ValueError(f"calibration must be None (measured here) or what pl.calibrate(model) "
                         f"returns, got {type(calibration).__name__} {calibration!r:.60}")
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
                             gpus_per_node, optimizer)
    mesh = list(source.meshes(devices, batch_size))
    if not mesh:
        raise ValueError(f"no candidate: with batch_size={batch_size}, devices={devices} cannot "
                         f"be factored as pipeline × data × tensor: p must be at most "
                         f"{source.max_stages(False)} (one layer a stage), dp must divide "
                         f"batch_size, tp must {source.tensor_rule}; try a batch_size that "
                         f"more device counts divide, or another number of devices")
    search = _pruned if prune else _exhaustive
    usable = memory_per_device * (1 - memory_headroom)
    out = search(source, _shapes(source, mesh, schedules, chunks, microbatches, batch_size),
                 recompute, usable)
    if not out:
        asked = "" if microbatches is None else (
            f" and microbatches={list(microbatches)} (each must divide a replica's "
            f"batch_size / data-parallel degree)")
        raise ValueError(f"no candidate: with batch_size={batch_size}, devices={devices}{asked} "
                         f"no schedule of {list(schedules)} can be built")
    ranked = Plan(out, source, devices, usable, batch_size, memory_headroom)
    if any(c.fits for c in out):
        ranked.best                # found now, best-first: the rest wait until something reads them
    return ranked


def _shapes(source, mesh, schedules, chunks, microbatches, batch_size):
    """(schedule, p, dp, tp, ep, m, v, rows per microbatch) of every candidate the source
    allows, in the search's order, before asking whether the schedule exists at that size."""
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
                yield name, p, dp, tp, ep, m, v, per_replica // m


def _exhaustive(source, shapes, recompute, budget: float) -> list[Candidate]:
    """Every candidate simulated, its memory read along its timeline (`prune=False`)."""
    out = []
    for name, p, dp, tp, ep, m, v, rows in shapes:
        sched = _schedule(name, p, m, v, dp)
        if sched is None:
            continue                             # the schedule does not exist at this size
        bounds = source.bounds(p * v, rows, name in VOCAB)
        again = None                             # the schedule with its recomputations R
        for policy in source.policies(recompute, tp):
            c = Candidate(name, p, dp, m, v, policy, rows, bounds, tp, ep)
            run = sched
            if policy != "none" and source.recompute_actions:
                if again is None:
                    again = with_recompute(sched).validate()
                run = again
            _predict(c, run, source)
            _judge(c, budget, source.unit)
            out.append(c)
    return out


def _pruned(source, shapes, recompute, budget: float) -> list[Candidate]:
    """Every candidate's memory (along its ranks' program order, peaks.py) and a lower bound on
    its step time (bound.py), each from its schedule's rows; simulations left to the plan, which
    runs them best-first (ranked.py). A schedule that exists at a size is generated once; it is
    validated only where it is simulated (the registered generators make valid schedules: the
    plan's length is the exhaustive search's, tests/test_plan_prune.py)."""
    out, made, chains, tables = [], {}, {}, {}
    for name, p, dp, tp, ep, m, v, rows in shapes:
        key = (name, p, m, v)
        if key not in made:
            order = _rows(SCHEDULES[name], name, p, m, v)
            made[key] = None if order is MISSING else [order, None]
        if made[key] is None:
            continue                             # the schedule does not exist at this size
        bounds = source.bounds(p * v, rows, name in VOCAB)
        for policy in source.policies(recompute, tp):
            c = Candidate(name, p, dp, m, v, policy, rows, bounds, tp, ep)
            again = policy != "none" and source.recompute_actions
            order = made[key][again]
            if order is None and again and made[key][0] is not None:
                order = made[key][1] = with_recompute_rows(made[key][0])
            if order is None:                    # a compound step: the timeline says it all
                _predict(c, _runnable(c, source), source)
            else:
                costs, c.static, table = source.model(c, order)
                if id(table) not in tables:        # a source shares its byte tables too
                    tables[id(table)] = table, stacked(table)
                c.activation_peak = order_peaks(order, tables[id(table)][1])
                c.memory_by_rank = [s + a for s, a in zip(c.static, c.activation_peak)]
                if id(costs) not in chains:       # a source shares one costs object
                    chains[id(costs)] = costs, chain_costs(costs, len(order.placement))
                c.bound = time_bound(order, chains[id(costs)][1], costs.message_time())
                c.defer(partial(_simulated, name, p, m, v, dp, again, costs))
            _judge(c, budget, source.unit)
            out.append(c)
    return out


def _simulated(name: str, p: int, m: int, v: int, dp: int, recomputed: bool, costs) -> float:
    """A candidate's step time: its schedule with its all-reduces (and its R), validated,
    simulated on its costs: what the exhaustive search computes."""
    sched = _schedule(name, p, m, v, dp)
    if sched is None:
        raise ValueError(f"the generator of {name!r} made a schedule (p={p}, m={m}, v={v}, "
                         f"dp={dp}) that does not validate")
    if recomputed:                                              # shared by the policies
        sched = _recomputed(SCHEDULES[name], name, p, m, v, dp)
    return simulate(sched, costs).makespan


def _judge(c: Candidate, budget: float, unit: tuple[str, float]) -> None:
    c.fits = c.peak_memory <= budget
    c.reason = "" if c.fits else _why_not(c, budget, unit)


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
        if optimizer not in SHAPE_OPTIMIZERS:
            raise ValueError(f"optimizer: a pl.ModelShape's bytes are mixed-precision Adam's, "
                             f"'adamw' (18 bytes a parameter) or 'zero-1' (its state sharded "
                             f"over the replicas: 6 + 12/dp), got {optimizer!r}")
        return ShapedModel
    raise ValueError(f"model must be a pl.ModelConfig or a pl.ModelShape (or a "
                     f"pl.CustomModel), got {type(model).__name__}")


# Registered schedules the planner has no candidate shape for (it would split them wrongly).
NOT_PLANNED = {"stp": "its V placement holds two stages per rank with offload, which the "
                      "planner's candidates (one split per rank, or `chunks` of them) do not "
                      "describe"}


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
    unplanned = [s for s in schedules if s not in source.schedules and s in NOT_PLANNED]
    if unplanned:
        raise ValueError(f"schedules: {unplanned[0]} cannot be planned: {NOT_PLANNED[unplanned[0]]}; "
                         f"the planner plans {', '.join(source.schedules)}")
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
# name registered anew builds afresh; bounded, as one plan of 16 devices builds ~600.
@lru_cache(maxsize=512)
def _validated(generator, name: str, p: int, m: int, v: int, dp: int):
    """With its all-reduces, validated once (its candidates of every policy and tensor degree
    share it, and the order validation finds, which the simulator reuses), or None."""
    base = _generated(generator, name, p, m, v)
    try:
        return None if base is None else with_data_parallel(base, dp).validate()
    except ValueError:
        return None


@lru_cache(maxsize=512)
def _generated(generator, name: str, p: int, m: int, v: int):
    """The schedule as its generator makes it, not validated (validating it with its
    all-reduces says the same), or None where the generator refuses the size."""
    return _build(name, p, m, v)


def _build(name: str, p: int, m: int, v: int):
    """`_generated`, made afresh (its callers cache it, keyed on the generator)."""
    try:
        return build_schedule(name, ranks=p, microbatches=m,
                              **({"chunks": v} if name in CHUNKED else {}))
    except ValueError:
        return None


MISSING = object()      # `_rows` of a size the generator refuses (None: a compound step's)


# What the pruned search keeps of a schedule: three arrays, not an object per action (a plan of
# 144 devices generates ~1,900 schedules, some of 10^5 actions). The schedule itself is made
# again where a candidate is simulated (`_validated`).
@lru_cache(maxsize=4096)
def _rows(generator, name: str, p: int, m: int, v: int):
    """`rows_of` the generated schedule (None where a step is a compound), or MISSING."""
    base = _build(name, p, m, v)
    return MISSING if base is None else rows_of(base)


@lru_cache(maxsize=64)
def _recomputed(generator, name: str, p: int, m: int, v: int, dp: int):
    """`_validated` with its recomputations R, validated (the policies' candidates share it)."""
    return with_recompute(_validated(generator, name, p, m, v, dp)).validate()


def clear_caches() -> None:
    """Forget the schedules built so far: the next plan starts cold (a benchmark's repeats)."""
    for cache in (_validated, _generated, _recomputed, _rows):
        cache.cache_clear()


def _predict(c: Candidate, sched, source) -> None:
    """Simulate the candidate's step and read its memory along the timeline (the exhaustive
    search's way)."""
    costs, c.static, table = source.model(c, sched)
    tl = simulate(sched, costs)
    c.step_time = tl.makespan
    c.activation_peak = activation_peaks(tl, kind_table(table))
    c.memory_by_rank = [s + a for s, a in zip(c.static, c.activation_peak)]


def _why_not(c: Candidate, budget: float, unit: tuple[str, float]) -> str:
    r, (name, size) = int(np.argmax(c.memory_by_rank)), unit
    return (f"rank {r} would hold {c.memory_by_rank[r] / size:.1f} {name} > "
            f"{budget / size:.1f} {name} ({c.activation_peak[r] / size:.1f} {name} of "
            f"activations, {c.static[r] / size:.1f} {name} of parameters, gradients and "
            f"optimizer state)")
