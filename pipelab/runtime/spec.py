"""What one pipeline run needs, checked completely before any worker moves.

`prepare_run` turns the user's arguments into a `RunSpec` (plain, picklable data that every rank
receives) or raises ValueError / ScheduleError naming the offending parameter. A bad argument
must never reach the workers: a half-started pipeline is much harder to explain than a message.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace

import torch

from ..checks import boolean, positive_int, positive_number, seed as check_seed
from ..model.data import VOCAB_SIZE
from ..sim.link import Link, check_link
from ..model.gpt import ModelConfig
from ..model.gpt_source import model_source
from ..model.source import ModelSource
from ..sim.partition import Partition, partition as make_partition, uniform_bounds
from ..schedules import Action, Schedule
from ..schedules.kinds import INPUT_GRADIENT, KIND_SPECS, OFFLOAD
from .boundary import Boundary
from .handlers import HANDLERS
from .mesh import Mesh
from .plugins import plugins_for
from . import torch_engine
from .techniques import prepare_all
from ..model.footprint import check_run
from ..schedules.reductions import REPLICA_SUM

#: How the activation meter counts (RunSpec.meter): one hooked forward per stage, or every one.
METERS = ("sampled", "full")

#: Test hooks: make an action hang, raise, or lose the messages it sends.
INJECTIONS = ("stall", "raise", "drop", "lag")


@dataclass
class RunSpec:
    schedule: Schedule
    cfg: "ModelConfig | ModelSource"     # the model: the toy GPT's config, or a pl.CustomModel
    bounds: list[tuple[int, int]]        # [start, stop) of the flat layer list, per stage
    #                                      (replicas of one model part have the same bounds)
    batch_size: int
    seed: int = 0                        # seeds the batches; weights come from cfg.seed
    steps: int = 1
    lr: float = 3e-3
    check: bool = True                   # ship step-0 gradients back for the reference check
    partition_name: str = "uniform"
    inject: dict[str, Action] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()        # modules defining the schedule's non-pipelab kinds
    data_parallel: int = 1               # replicas of the pipeline (each takes 1/dp of the batch)
    inject_replica: int | None = None    # test hook: inject only into this replica
    recompute: tuple = ()                # recompute.Policy per stage; () keeps every activation
    tensor_parallel: int = 1             # shards of each pipeline rank (techniques/tensor.py)
    expert_parallel: int = 1             # the dp group divides each MoE layer's experts
    link: Link | None = None             # an emulated link every transfer waits out (sim/link.py)
    techniques: tuple[str, ...] = ()     # the registered techniques this run uses (techniques.py)
    gradient_check: bool = True          # False: a technique checks the run its own way
    #                                      (weight versions), not against the unsplit gradients
    braided: bool = False                # a compound step's parts run side by side, where a
    #                                      technique has asynchronous work to hide (executor.py)
    # A model source other than the toy GPT: {layer: Boundary} for each stage boundary (after
    # that layer), measured in the parent by running the stack once; None: the GPT's boundary.
    boundaries: dict | None = None
    # "sampled": the activation meter hooks one forward per stage where that is exact, "full":
    # every forward (meter.py, sampling.py); the figures are the same, the cost is not
    meter: str = "sampled"
    # engine="torch" (torch_engine.py): the schedule as torch's CSV, which torch's runtime runs,
    # and where its ranks write torch.profiler traces (None: no trace)
    engine: str = "pipelab"
    torch_csv: str | None = None
    torch_trace: str | None = None

    @property
    def model(self) -> ModelSource:
        """What the runtime builds, draws and checks (model/source.py)."""
        return model_source(self.cfg)

    def crossing(self) -> dict:
        """The boundaries that need packing (not one float tensor), by layer (stage.py)."""
        return {layer: b for layer, b in (self.boundaries or {}).items() if not b.plain}

    def message(self, producer: Action) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of what `producer` (a forward or a backward) sends across a boundary."""
        if self.boundaries is None:
            return self.boundary_shape(), torch.float32
        start, stop = self.bounds[producer.stage]
        if KIND_SPECS[producer.kind].output == INPUT_GRADIENT:
            return self.boundaries[start - 1].gradient()
        return self.boundaries[stop - 1].message()

    def message_bytes(self) -> int:
        """Bytes of the largest activation message between stages."""
        if self.boundaries is None:
            return 4 * self.rows_per_microbatch * self.cfg.seq_len * self.cfg.d_model
        return max((_bytes(*b.message()) for b in self.boundaries.values()), default=0)

    @property
    def mesh(self) -> Mesh:
        return Mesh(pp=self.schedule.ranks, dp=self.data_parallel, tp=self.tensor_parallel)

    @property
    def rows_per_replica(self) -> int:
        return self.batch_size // self.data_parallel

    @property
    def rows_per_microbatch(self) -> int:
        return self.batch_size // (self.schedule.microbatches * self.data_parallel)

    def boundary_shape(self) -> tuple[int, int, int]:
        """Every activation and gradient crossing a stage boundary: (rows, seq, d_model) float32."""
        return (self.rows_per_microbatch, self.cfg.seq_len, self.cfg.d_model)


# The shortest no-progress timeout accepted: on a busy machine a healthy rank can go a good
# fraction of a second without being scheduled, and a microsecond timeout reported a stall at once.
MIN_TIMEOUT = 1.0


def check_timeout(value) -> float:
    """`value` in seconds if it is a finite number >= MIN_TIMEOUT; else ValueError."""
    timeout = positive_number("timeout", value, "number of seconds")
    if timeout < MIN_TIMEOUT:
        raise ValueError(f"timeout={value!r} s is below the minimum of {MIN_TIMEOUT:g} s: a busy "
                         f"machine can leave a healthy rank unscheduled that long, which would "
                         f"read as a stall")
    return timeout


def _bytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


@dataclass
class Draft:
    """A run being prepared, as the techniques' prepare hooks see it (runtime/techniques.py):
    they check their keywords in `options` and may rewrite the schedule, the data-parallel
    degree, the per-stage recompute policies, or ask for the model to be split as if untied."""
    schedule: Schedule
    cfg: "ModelConfig | ModelSource"
    ranks: int
    options: dict                        # the technique keywords of cluster.run, as given
    data_parallel: int = 1
    tensor_parallel: int = 1
    expert_parallel: int = 1
    steps: int = 1
    partition: object = None
    batch_size: object = None
    check: object = True
    recompute: tuple = ()                # one policy per stage, set by the recompute technique
    split_untied: bool = False           # each rank holds both tied tables (vocabulary shards)
    partition_name: str = "uniform"
    gradient_check: bool = True
    braided: bool = False
    checks: list = field(default_factory=list)   # run after every prepare hook (see `later`)
    _bounds: list | None = None

    def later(self, check) -> None:
        """Run `check(draft)` once every technique has prepared: for a rule that reads what
        another technique decided."""
        self.checks.append(check)

    def bounds(self) -> list[tuple[int, int]]:
        """[start, stop) of each stage (weight replicas share theirs), split once: the footprint
        is checked first, so a model this machine cannot hold is refused before its split."""
        if self._bounds is None:
            cfg, schedule = self.cfg, self.schedule
            if cfg.tie_embeddings and schedule.stages > 1 and not self.split_untied:
                raise ValueError("model.tie_embeddings is not supported across pipeline stages: "
                                 "the embedding and the head share a weight but would live on "
                                 "different stages; use tie_embeddings=False")
            if isinstance(cfg, ModelConfig):
                _check_fits(self)
                parts, self.partition_name = _split(cfg, schedule.model_slices, self.partition,
                                                    self.split_untied)
            else:
                parts, self.partition_name = _split_layers(cfg, schedule.model_slices,
                                                           self.partition)
            self._bounds = [parts[schedule.slice_of(s)] for s in range(schedule.stages)]
        return self._bounds


def _split(cfg: ModelConfig, stages: int, partition,
           sharded: bool = False) -> tuple[list[tuple[int, int]], str]:
    try:
        if partition is None or isinstance(partition, str):
            method = partition or "uniform"
            # Tied tables on different stages are refused by `partition`, unless each rank
            # holds both halves of its vocabulary shard (vocab-1/2): split as if untied.
            parts = make_partition(replace(cfg, tie_embeddings=False) if sharded else cfg,
                                   stages, method)
        elif isinstance(partition, Partition):
            parts, method = partition, partition.method
            if parts.bounds[-1][1] != cfg.total_layers:
                raise ValueError(f"it covers {parts.bounds[-1][1]} layers but the model has "
                                 f"{cfg.total_layers}; build it with pl.partition(cfg, ...)")
        else:
            parts, method = Partition(cfg, [tuple(b) for b in partition], "custom"), "custom"
    except (TypeError, ValueError) as err:
        raise ValueError(f"partition={partition!r}: {err}") from None
    if parts.stages != stages:
        raise ValueError(f"partition has {parts.stages} stages but the schedule cuts the model "
                         f"into {stages} (ranks × chunks, one per pair of weight replicas); use "
                         f"pl.partition(cfg, stages={stages}, ...)")
    return [tuple(b) for b in parts.bounds], method


def _split_layers(model: ModelSource, stages: int, partition) -> tuple[list[tuple[int, int]], str]:
    """The split of a model other than the toy GPT: uniform, or the (start, stop) ranges given."""
    n = model.total_layers
    if stages > n:
        raise ValueError(f"the model has {n} layers but the schedule cuts it into {stages} stages "
                         f"(ranks × chunks): every stage needs a layer, so the model's layers "
                         f"function must return at least {stages}")
    if partition is None or partition == "uniform":
        return uniform_bounds(n, stages), "uniform"
    if isinstance(partition, Partition):
        bounds, method = partition.bounds, partition.method
    elif isinstance(partition, (list, tuple)):
        bounds, method = partition, "custom"
    else:
        raise ValueError(f"partition={partition!r}: a custom model is split 'uniform' or by a "
                         f"list of (start, stop) layer ranges, one per stage")
    try:
        bounds = [(operator.index(a), operator.index(b)) for a, b in bounds]
    except (TypeError, ValueError):
        raise ValueError(f"partition={partition!r}: each stage must be a (start, stop) pair of "
                         f"layer indices") from None
    covered = [i for a, b in bounds for i in range(a, b)]
    if any(b <= a for a, b in bounds) or covered != list(range(n)):
        raise ValueError(f"partition={partition!r}: the ranges must be non-empty and cover "
                         f"layers 0..{n - 1} in order, each exactly once")
    if len(bounds) != stages:
        raise ValueError(f"partition has {len(bounds)} stages but the schedule cuts the model "
                         f"into {stages} (ranks × chunks, one per pair of weight replicas)")
    return bounds, method


def _check_custom(model: ModelSource, schedule: Schedule, tensor_parallel: int,
                  expert_parallel: int) -> None:
    """Refuse what needs the toy GPT's inside, for a model pipelab did not build: before any
    technique prepares, so the reason is the model, not a symptom."""
    inside = "pipelab knows the toy GPT's layers, not this model's"
    if tensor_parallel > 1:
        raise ValueError(f"tensor_parallel={tensor_parallel} with a custom model: tensor "
                         f"parallelism splits the GPT block's attention heads and MLP, and "
                         f"{inside}; use tensor_parallel=1")
    if expert_parallel > 1:
        raise ValueError(f"expert_parallel={expert_parallel} with a custom model: expert "
                         f"parallelism divides pipelab's own mixture-of-experts layers, and "
                         f"{inside}; use expert_parallel=1")
    own = sorted(kind for kind in schedule.kinds() if HANDLERS[kind].setup is not None)
    if own:
        raise ValueError(f"schedule {schedule.name!r} has kinds {', '.join(own)} that build "
                         f"parameters of their own from the GPT's layers (vocabulary shards); "
                         f"{inside}: pick a schedule of forwards and backwards")


def _check_custom_prepared(draft: Draft) -> None:
    """Refuse, once the techniques have prepared, a run one of them reshaped around the GPT."""
    if draft.split_untied:
        why = "shards the vocabulary tables"
    elif not draft.gradient_check:
        why = "updates the weights inside the schedule, checked against an emulation of the toy GPT"
    else:
        return
    raise ValueError(f"schedule {draft.schedule.name!r} with a custom model: it {why}, and "
                     f"pipelab knows the toy GPT's layers, not this model's: pick a schedule "
                     f"of forwards and backwards")


def _check_fits(draft: Draft) -> None:
    """Refuse a run that cannot fit in this machine's memory (footprint.py), before the split
    (which lists every layer) or any worker; the arguments checked later are taken as given
    when they are valid, else at their defaults."""
    m, dp = draft.schedule.microbatches, draft.data_parallel

    def valid(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    check_run(draft.cfg, processes=draft.ranks, replicas=dp, microbatches=m,
              batch_size=draft.batch_size if valid(draft.batch_size) else 2 * m * dp,
              steps=draft.steps if valid(draft.steps) else 1, check=draft.check is not False,
              recompute=draft.options.get("recompute") not in (None, "none"),
              expert=draft.expert_parallel)


def _injections(schedule: Schedule, inject,
                replicas: int = 1) -> tuple[dict[str, Action], int | None]:
    out, replica = {}, None
    for key, value in (inject or {}).items():
        if key == "replica":           # only this data-parallel replica misbehaves
            if not isinstance(value, int) or not 0 <= value < replicas:
                raise ValueError(f"_inject: replica must be 0..{replicas - 1}, got {value!r}")
            replica = value
            continue
        if key not in INJECTIONS:
            raise ValueError(f"_inject: unknown key {key!r}; use {', '.join(INJECTIONS)}")
        action = value if isinstance(value, tuple) else Action.parse(str(value))
        if not any(action in acts for acts in schedule.actions):
            raise ValueError(f"_inject: {action} is not an action of this schedule")
        out[key] = action
    return out, replica


def prepare_run(schedule, *, ranks: int, model=None, partition=None, seed: int = 0,
                batch_size: int | None = None, steps: int = 1, lr: float = 3e-3,
                check: bool = True, inject=None, data_parallel: int = 1,
                recompute=None, tensor_parallel: int = 1, expert_parallel: int = 1,
                link=None, _meter: str = "sampled", engine: str = "pipelab",
                torch_trace=None) -> RunSpec:
    """Check every argument of a run; return the RunSpec the ranks execute.

    `ranks` is the number of processes: the schedule's pipeline ranks × `data_parallel`
    replicas × `tensor_parallel` shards. The checks of the run itself are here; each registered
    technique (data, tensor, expert and vocabulary parallelism, recomputation, updates inside
    the schedule) checks its own keywords and adapts the run in its prepare hook
    (runtime/techniques.py): with data_parallel > 1 the gradient all-reduces are inserted,
    `expert_parallel` divides the experts over the data-parallel group, `recompute` adds R
    actions. `link` (a pl.Link) makes every message and collective wait as on it. `_meter`
    ("sampled" or "full"): how the activation meter counts (meter.py), for tests and ablations.
    `engine="torch"` runs the exported schedule on torch's runtime (torch_engine.py): what it
    cannot run is refused here; `torch_trace` (a directory) is its ranks' profiler traces."""
    engine = torch_engine.check_engine(engine)
    if engine == "torch":
        torch_engine.check_options(data_parallel=data_parallel, tensor_parallel=tensor_parallel,
                                   expert_parallel=expert_parallel, recompute=recompute,
                                   link=link, inject=inject)
    elif torch_trace is not None:
        raise ValueError(f"torch_trace={torch_trace!r} records torch's runtime: use it with "
                         f"engine='torch'")
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a pl.Schedule (e.g. pl.schedule('1f1b', ranks=2, "
                         f"microbatches=4)), got {type(schedule).__name__}")
    link = check_link(link)
    if _meter not in METERS:
        raise ValueError(f"_meter={_meter!r}: the activation meter is 'sampled' (one hooked "
                         f"forward per stage, the default) or 'full' (every forward hooked)")
    dp = positive_int("data_parallel", data_parallel)
    tp = positive_int("tensor_parallel", tensor_parallel)
    ep = positive_int("expert_parallel", expert_parallel)
    cfg = ModelConfig() if model is None else model
    if not isinstance(cfg, (ModelConfig, ModelSource)):
        raise ValueError(f"model must be a pl.ModelConfig or a pl.CustomModel (each rank builds "
                         f"its own layers from it), got {type(model).__name__}")
    custom = not isinstance(cfg, ModelConfig)
    if custom:
        _check_custom(cfg, schedule, tp, ep)
    elif cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model.vocab_size ({cfg.vocab_size}) must be at least the tokenizer's "
                         f"VOCAB_SIZE ({VOCAB_SIZE})")
    schedule.validate()
    torch_csv = torch_engine.export(schedule) if engine == "torch" else None
    if recompute not in (None, "none") and OFFLOAD in schedule.kinds():
        raise ValueError(f"recompute={recompute!r} with an offloading schedule: offload moves "
                         f"what a forward saves, recomputation drops it; use one of the two "
                         f"(recompute='none', or a schedule without offload)")
    draft = Draft(schedule, cfg, ranks, {"recompute": recompute}, dp, tp, ep, steps, partition,
                  batch_size, check)
    used = prepare_all(draft)
    if engine == "torch" and used:
        raise ValueError(f"engine='torch' does not run pipelab's techniques "
                         f"{', '.join(used)} (schedule {schedule.name!r} needs them): run it "
                         f"on engine='pipelab'")
    for later in draft.checks:
        later(draft)
    if custom:
        _check_custom_prepared(draft)
    schedule, dp = draft.schedule, draft.data_parallel
    if schedule.ranks * dp * tp != ranks:
        raise ValueError(f"schedule has {schedule.ranks} ranks but the cluster has {ranks}: "
                         f"build the schedule with ranks={ranks} or use LocalCluster(ranks="
                         f"{schedule.ranks})")
    bounds = draft.bounds()
    if link is not None:
        _check_link_kinds(schedule)
    plugins = plugins_for(schedule, used)
    m = schedule.microbatches
    batch_size = 2 * m * dp if batch_size is None else positive_int("batch_size", batch_size)
    if batch_size % (m * dp):
        if dp == 1:
            raise ValueError(f"batch_size={batch_size} does not split into {m} microbatches: "
                             f"batch_size must be a multiple of microbatches (e.g. {2 * m})")
        raise ValueError(f"batch_size={batch_size} does not split into {dp} replicas × {m} "
                         f"microbatches: batch_size must be a multiple of data_parallel × "
                         f"microbatches = {m * dp} (e.g. {2 * m * dp})")
    check_seed("seed", seed)
    boolean("check", check)
    positive_int("steps", steps)
    positive_number("lr", lr)
    injections, replica = _injections(schedule, inject, dp)
    boundaries = _boundaries(cfg, bounds, batch_size, m * dp, seed) if custom else None
    if engine == "torch":
        torch_engine.check_batch(model_source(cfg), batch_size, seed)
        torch_trace = None if torch_trace is None else str(torch_engine.check_trace_dir(torch_trace))
    return RunSpec(schedule, cfg, bounds, batch_size, seed, steps, float(lr), bool(check),
                   draft.partition_name, injections, plugins, dp, replica, draft.recompute, tp,
                   ep, link, used, draft.gradient_check, draft.braided, boundaries, _meter,
                   engine, torch_csv, torch_trace)


def _boundaries(model, bounds: list[tuple[int, int]], batch_size: int, parts: int,
                seed: int) -> dict[int, Boundary]:
    """What crosses each stage boundary of a custom model, from one run of its first
    microbatch through the whole stack here (which also checks the three functions)."""
    outputs = model.trace(batch_size, parts, seed)
    cuts = sorted({stop - 1 for _start, stop in bounds if stop < len(outputs)})
    return {layer: Boundary.of(outputs[layer], f"layer {layer} (the last of a stage)")
            for layer in cuts}


def _check_link_kinds(schedule: Schedule) -> None:
    """ValueError if the schedule has collectives the link cannot hold: the runtime emulates
    messages, gradient all-reduces and sums (AR, G), tensor-parallel all-reduces and expert
    all-to-alls; a collective kind's own handler (vocabulary passes, a plugin's) talks to
    torch.distributed directly, and would silently run at loopback speed."""
    other = sorted(kind for kind in schedule.kinds()
                   if KIND_SPECS[kind].collective and kind != REPLICA_SUM)
    if other:
        raise ValueError(f"link=... is not supported yet with the collective kinds "
                         f"{', '.join(other)} of schedule {schedule.name!r} (their handlers "
                         f"call torch.distributed themselves): run it without a link")

