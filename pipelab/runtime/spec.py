"""What one pipeline run needs, checked completely before any worker moves.

`prepare_run` turns the user's arguments into a `RunSpec` (plain, picklable data that every rank
receives) or raises ValueError / ScheduleError naming the offending parameter. A bad argument
must never reach the workers: a half-started pipeline is much harder to explain than a message.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import boolean, positive_int, positive_number, seed as check_seed
from ..data import VOCAB_SIZE
from ..model import ModelConfig
from ..partition import Partition, partition as make_partition
from ..schedules import Action, Schedule
from .plugins import plugins_for

#: Test hooks: make an action hang, raise, or lose the messages it sends.
INJECTIONS = ("stall", "raise", "drop")


@dataclass
class RunSpec:
    schedule: Schedule
    cfg: ModelConfig
    bounds: list[tuple[int, int]]        # [start, stop) of the flat layer list, per stage
    batch_size: int
    seed: int = 0                        # seeds the batches; weights come from cfg.seed
    steps: int = 1
    lr: float = 3e-3
    check: bool = True                   # ship step-0 gradients back for the reference check
    partition_name: str = "uniform"
    inject: dict[str, Action] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()        # modules defining the schedule's non-pipelab kinds

    @property
    def rows_per_microbatch(self) -> int:
        return self.batch_size // self.schedule.microbatches

    def boundary_shape(self) -> tuple[int, int, int]:
        """Every activation and gradient crossing a stage boundary: (rows, seq, d_model) float32."""
        return (self.rows_per_microbatch, self.cfg.seq_len, self.cfg.d_model)


def check_timeout(value) -> float:
    return positive_number("timeout", value, "number of seconds")


def _bounds(cfg: ModelConfig, stages: int, partition) -> tuple[list[tuple[int, int]], str]:
    try:
        if partition is None or isinstance(partition, str):
            method = partition or "uniform"
            parts = make_partition(cfg, stages, method)
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
        raise ValueError(f"partition has {parts.stages} stages but the schedule has {stages} "
                         f"(ranks × chunks); use pl.partition(cfg, stages={stages}, ...)")
    return [tuple(b) for b in parts.bounds], method


def _injections(schedule: Schedule, inject) -> dict[str, Action]:
    out = {}
    for key, value in (inject or {}).items():
        if key not in INJECTIONS:
            raise ValueError(f"_inject: unknown key {key!r}; use {', '.join(INJECTIONS)}")
        action = value if isinstance(value, tuple) else Action.parse(str(value))
        if not any(action in acts for acts in schedule.actions):
            raise ValueError(f"_inject: {action} is not an action of this schedule")
        out[key] = action
    return out


def prepare_run(schedule, *, ranks: int, model=None, partition=None, seed: int = 0,
                batch_size: int | None = None, steps: int = 1, lr: float = 3e-3,
                check: bool = True, inject=None) -> RunSpec:
    """Check every argument of a run; return the RunSpec the ranks execute."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a pl.Schedule (e.g. pl.schedule('1f1b', ranks=2, "
                         f"microbatches=4)), got {type(schedule).__name__}")
    schedule.validate()
    if schedule.ranks != ranks:
        raise ValueError(f"schedule has {schedule.ranks} ranks but the cluster has {ranks}: "
                         f"build the schedule with ranks={ranks} or use LocalCluster(ranks="
                         f"{schedule.ranks})")
    cfg = ModelConfig() if model is None else model
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"model must be a pl.ModelConfig (each rank builds its own layers "
                         f"from it), got {type(model).__name__}")
    if cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model.vocab_size ({cfg.vocab_size}) must be at least the tokenizer's "
                         f"VOCAB_SIZE ({VOCAB_SIZE})")
    if cfg.tie_embeddings and schedule.stages > 1:
        raise ValueError("model.tie_embeddings is not supported across pipeline stages: the "
                         "embedding and the head share a weight but would live on different "
                         "stages; use tie_embeddings=False")
    plugins = plugins_for(schedule)
    bounds, method = _bounds(cfg, schedule.stages, partition)
    m = schedule.microbatches
    batch_size = 2 * m if batch_size is None else positive_int("batch_size", batch_size)
    if batch_size % m:
        raise ValueError(f"batch_size={batch_size} does not split into {m} microbatches: "
                         f"batch_size must be a multiple of microbatches (e.g. {2 * m})")
    check_seed("seed", seed)
    boolean("check", check)
    positive_int("steps", steps)
    positive_number("lr", lr)
    return RunSpec(schedule, cfg, bounds, batch_size, seed, steps, float(lr), bool(check),
                   method, _injections(schedule, inject), plugins)
