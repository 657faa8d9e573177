"""Notebook 16's helpers: a schedule chosen for a 7B shape on 8 GPUs under a memory limit,
exported to torch's file, run on torch's runtime here, its trace read back; and the map from
our schedules to torch's classes, TorchTitan's names and Megatron-LM's flags.

Data first: the notebook asserts on what these return, then draws it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.gpt import ModelConfig
from ..schedules import schedule as make_schedule
from ..schedules.base import Schedule
from ..schedules.torch_format import titan_schedule_class, torch_instance, torchtitan_command
from ..sim.costs import Costs
from ..sim.shape import ModelShape, shape_profile
from ..sim.simulate import simulate
from ..sim.timeline import Timeline

SHAPE_7B = ModelShape(hidden=4096, layers=32, heads=32, seq_len=4096, vocab=32000)
GPUS, MICROBATCHES = 8, 24
# Attention that keeps no seq x seq scores (FlashAttention, or Korthikanti et al.'s selective
# recomputation): the bytes of `shape_profile`'s "selective" policy, its cost in the backward.
RECOMPUTE = "selective"
CANDIDATES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min",
              "dualpipe-v", "zb-auto")


@dataclass(frozen=True)
class Candidate:
    """One schedule simulated at the shape: its step, bubble and fullest rank's bytes."""
    name: str
    schedule: Schedule
    step: float                 # seconds, simulated on the profile's device
    bubble: float               # idle share of the step
    peak_bytes: float           # fullest rank: weights, gradients, optimizer + live activations
    fits: bool


def rank_bytes(sched: Schedule, timeline: Timeline, profile) -> list[float]:
    """Each rank's bytes at its peak: the static bytes of its stages plus its peak live
    activations (microbatch-stage units) at its largest stage's bytes (an upper bound where a
    rank's stages differ: the first and last hold the embedding and the head)."""
    peaks = timeline.peak_activations()
    out = []
    for rank in range(sched.ranks):
        mine = sched.stages_of(rank)
        out.append(sum(profile.static_bytes[s] for s in mine)
                   + peaks[rank] * max(profile.activation_bytes[s] for s in mine))
    return out


def candidates(memory_limit: float, shape: ModelShape = SHAPE_7B, ranks: int = GPUS,
               microbatches: int = MICROBATCHES) -> list[Candidate]:
    """Every candidate schedule simulated from the shape (`pl.Costs.from_shape`'s profile, one
    sequence a microbatch, an A100-40GB by default), zb-auto built for this limit."""
    rows = []
    for name in CANDIDATES:
        stages = ranks * (2 if name in ("interleaved-1f1b", "zb-v", "v-half", "v-min",
                                        "dualpipe-v") else 1)
        profile = shape_profile(shape, 1, stages, recompute=RECOMPUTE)
        costs = Costs.per_stage(**profile.table)
        options = {}
        if name == "zb-auto":               # its limit in microbatch-stage units, per rank
            room = memory_limit - max(profile.static_bytes)
            options = dict(costs=costs, memory_limit=max(1.0, room / max(profile.activation_bytes)))
        sched = make_schedule(name, ranks=ranks, microbatches=microbatches, **options)
        timeline = simulate(sched, costs)
        peak = max(rank_bytes(sched, timeline, profile))
        rows.append(Candidate(name, sched, timeline.makespan, timeline.bubble_fraction(), peak,
                              peak <= memory_limit))
    return rows


def choose(rows: list[Candidate]) -> Candidate:
    """The fastest candidate that fits."""
    fitting = [r for r in rows if r.fits]
    if not fitting:
        raise ValueError("no candidate fits the memory limit: raise it, or add recomputation")
    return min(fitting, key=lambda r: r.step)


def candidate_table(rows: list[Candidate], memory_limit: float) -> str:
    lines = [f"{'schedule':18}{'step (s)':>9}{'bubble':>8}{'fullest rank (GB)':>19}  fits "
             f"{memory_limit / 1e9:.0f} GB"]
    for r in sorted(rows, key=lambda r: r.step):
        lines.append(f"{r.name:18}{r.step:9.3f}{r.bubble:8.1%}{r.peak_bytes / 1e9:19.1f}  "
                     f"{'yes' if r.fits else 'no'}")
    return "\n".join(lines)


def export(sched: Schedule, path: str | Path) -> tuple[str, str]:
    """(the file's text, TorchTitan's launch line for it)."""
    text = sched.to_torch_csv(path)
    return text, torchtitan_command(sched, path)


# --- live, on torch's runtime -------------------------------------------------------------------
LIVE_MODEL = ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=32)


def run_live(cluster, name: str, folder: str | Path, microbatches: int = 4):
    """`name` on 2 ranks of torch's runtime from its exported file, traced: (the run's result,
    the timeline read back from torch's profiler traces, the simulation fitted from them)."""
    sched = make_schedule(name, ranks=cluster.ranks, microbatches=microbatches)
    res = cluster.run(sched, model=LIVE_MODEL, engine="torch", torch_trace=str(folder),
                      batch_size=2 * microbatches, steps=2, progress=False)
    traced = Timeline.from_torch_trace(folder, schedule=sched)
    fitted = simulate(sched, Costs.fit(traced, sched.stages, statistic="min"))
    return res, traced, fitted


# --- where each schedule lives elsewhere ------------------------------------------------------
# (ours, torch.distributed.pipelining class, TorchTitan --parallelism.pipeline_parallel_schedule,
#  Megatron-LM (core) flags). Megatron-LM's core has two pipeline schedules: 1F1B, and the
# interleaved one when a rank holds several virtual stages.
MEGATRON_1F1B = "--pipeline-model-parallel-size P"
MEGATRON_INTERLEAVED = "--pipeline-model-parallel-size P --num-layers-per-virtual-pipeline-stage L"
MAP = [
    ("gpipe", "ScheduleGPipe", "GPipe", "none (1F1B only)"),
    ("1f1b", "Schedule1F1B", "1F1B", MEGATRON_1F1B),
    ("interleaved-1f1b", "ScheduleInterleaved1F1B", "Interleaved1F1B", MEGATRON_INTERLEAVED),
    ("looped-bfs", "ScheduleLoopedBFS", "LoopedBFS", "none"),
    ("zb-h1", "ScheduleInterleavedZeroBubble (2 stages a rank: no 1-stage peer)", "CSV + 1F1B",
     "none in core; the ZB authors ship a patch for it"),
    ("zb-h2", "none", "CSV + 1F1B", "none in core"),
    ("zb-auto", "none", "CSV + 1F1B", "none in core"),
    ("zb-v", "ScheduleZBVZeroBubble", "ZBVZeroBubble",
     "none in core; the ZB authors' Megatron-LM fork: --zero-bubble-v-schedule"),
    ("v-half", "none", "CSV + ZBVZeroBubble", "none in core"),
    ("v-min", "none", "CSV + ZBVZeroBubble", "none in core"),
    ("dualpipe-v", "ScheduleDualPipeV", "DualPipeV (or CSV + ZBVZeroBubble)", "none in core"),
]
# The torch classes whose table is ours step for step (checked by `same_table`).
SAME_TABLE = ("gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipe-v")


def same_table(name: str, torch_class: str, ranks: int = 4, microbatches: int = 8) -> bool:
    """Whether torch's `torch_class` table, read with `Schedule.from_torch`, is schedule
    `name`'s, action for action (without running anything)."""
    ours = make_schedule(name, ranks=ranks, microbatches=microbatches)
    theirs = Schedule.from_torch(torch_instance(torch_class, ranks, microbatches, ours.chunks))
    return theirs.actions == ours.actions and theirs.placement == ours.placement


def map_table() -> str:
    """The map as a markdown table; the TorchTitan column of a CSV row names the class whose
    stage placement the exported file needs (`titan_schedule_class`)."""
    lines = ["| pipelab | torch.distributed.pipelining | TorchTitan schedule | Megatron-LM |",
             "|---|---|---|---|"]
    for name, torch_class, titan, megatron in MAP:
        lines.append(f"| {name} | {torch_class} | {titan} | {megatron} |")
    return "\n".join(lines)


def titan_class_of(name: str, ranks: int = GPUS, microbatches: int = MICROBATCHES) -> str | None:
    return titan_schedule_class(make_schedule(name, ranks=ranks, microbatches=microbatches))
