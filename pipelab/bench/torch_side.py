"""torch.distributed.pipelining on pipelab's stages, run inside LocalCluster workers.

    cluster.call("pipelab.bench.torch_side:run_step", job)   # one dict per rank

`job` (see `make_job`) names a torch schedule class, the stage → rank placement style (torch's
"loop" or "v", as `generate_stage_to_rank_mapping` places them), the model config, the stage
bounds, the batch and the microbatch count. Each rank's stages are the runtime's
`RankStages`: the layers, weights and parameter names pipelab's runtime builds, so both runtimes
compute the same function. Stages and schedule objects are kept between calls with the same shape (building
them, and torch's shape inference on the first step, are not part of a step).

A step is timed as pipelab's executor times one: from the end of a barrier to the end of the
forward and backward of every microbatch on this rank (no optimizer); the benchmark takes the
span from the earliest start to the latest end over the ranks.
"""
from __future__ import annotations

import time

import torch

from ..model.data import get_batch
from ..model.gpt import ModelConfig, loss_fn
from ..runtime.stage import RankStages
from ..runtime.torch_engine import plain_linears
from ..schedules import loop_placement, v_placement
from .profiling import profiler as make_profiler, summarize

#: pipelab schedule name -> (torch class, placement style). zb-h1/zb-h2 have no exact torch
#: peer: ScheduleInterleavedZeroBubble is torch's ZB1P (ZB-H1-like, interleaved).
TORCH_PEERS = {
    "gpipe": ("ScheduleGPipe", "loop"),
    "1f1b": ("Schedule1F1B", "loop"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "looped-bfs": ("ScheduleLoopedBFS", "loop"),
    "zb-v": ("ScheduleZBVZeroBubble", "v"),
    "zb-h1": ("ScheduleInterleavedZeroBubble", "loop"),
    "zb-h2": ("ScheduleInterleavedZeroBubble", "loop"),
    "dualpipe-v": ("ScheduleDualPipeV", "v"),
}

_BUILT: dict = {}          # shape key -> (our stages, torch's stages, schedule): one entry, the last shape


def placement(style: str, ranks: int, chunks: int) -> tuple[int, ...]:
    """Which rank owns each stage, as torch places them."""
    if style == "v":
        if chunks != 2:
            raise ValueError(f"a V placement has 2 stages per rank, not {chunks}")
        return v_placement(ranks)
    return loop_placement(ranks, chunks)


def make_job(schedule: str, *, ranks: int, microbatches: int, cfg: ModelConfig,
             bounds, batch_size: int, seed: int = 0, chunks: int = 1, style: str = "loop",
             grads: bool = False, profile: bool = False) -> dict:
    return {"schedule": schedule, "ranks": ranks, "microbatches": microbatches, "cfg": cfg,
            "bounds": [tuple(b) for b in bounds], "batch_size": batch_size, "seed": seed,
            "chunks": chunks, "style": style, "grads": grads, "profile": profile}


def _build(job: dict, rank: int):
    from torch.distributed.pipelining import PipelineStage, schedules
    key = tuple((k, repr(v)) for k, v in sorted(job.items()) if k not in ("seed", "grads", "profile"))
    if key in _BUILT:
        return _BUILT[key]
    _BUILT.clear()
    place = placement(job["style"], job["ranks"], job["chunks"])
    if len(place) != len(job["bounds"]):
        raise ValueError(f"{len(job['bounds'])} stage bounds for {len(place)} stages")
    cls = getattr(schedules, job["schedule"])
    cfg, n = job["cfg"], len(place)
    mine = [s for s, r in enumerate(place) if r == rank]
    # the layers and names our runtime builds, with torch's own Linears (as the torch engine)
    ours = plain_linears(RankStages(cfg, job["bounds"], mine))
    stages = [PipelineStage(ours.modules[s], s, n, torch.device("cpu")) for s in mine]
    if issubclass(cls, schedules.PipelineScheduleSingle):
        if len(stages) != 1:
            raise ValueError(f"{job['schedule']} runs one stage per rank, not {len(stages)}")
        sched = cls(stages[0], job["microbatches"], loss_fn=loss_fn)
    else:
        sched = cls(stages, job["microbatches"], loss_fn=loss_fn)
    built = (ours, stages, sched, 0 in mine, n - 1 in mine)
    _BUILT[key] = built
    return built


def run_step(job: dict) -> dict:
    """One forward+backward step of torch's schedule on this rank; timings, losses, gradients."""
    import torch.distributed as dist
    rank = dist.get_rank()
    ours, _stages, sched, first, last = _build(job, rank)
    cfg = job["cfg"]
    inputs, targets = get_batch(job["batch_size"], cfg.seq_len,
                                generator=torch.Generator().manual_seed(job["seed"]))
    ours.zero_grad()
    args = (inputs,) if first else ()
    losses: list = []
    kwargs = {"target": targets, "losses": losses} if last else {}
    profiler = None
    if job["profile"]:
        profiler = make_profiler()
    dist.barrier()                                 # every rank starts together, as ours do
    begin, cpu0 = time.perf_counter(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    sched.step(*args, return_outputs=False, **kwargs)
    if profiler is not None:
        profiler.disable()
    cpu, end = time.thread_time() - cpu0, time.perf_counter()
    report = {"rank": rank, "begin": begin, "end": end, "cpu": cpu,
              "losses": [float(x.detach()) for x in losses],
              "actions": sum(1 for a in sched_actions(sched, rank)),
              "grads": ours.gradients() if job["grads"] else None}
    if profiler is not None:
        report["profile"] = summarize(profiler)
    return report


def sched_actions(sched, rank: int) -> list[str]:
    """This rank's compute steps (F, B, I, W, overlapped F+B pairs) in torch's table, as
    strings like '1F3' or '0F3+3B1'."""
    order = getattr(sched, "pipeline_order", None) or {}
    return [_text(a) for a in order.get(rank, []) if _computes(a)]


def _computes(action) -> bool:
    return action is not None and action.computation_type.value in ("F", "B", "I", "W",
                                                                     "OVERLAP_F_B")


def _text(action) -> str:
    """Our text for torch's action: `1F3`, or a pair `(0F3;3B1)OVERLAP_F_B` as `0F3+3B1`."""
    parts = getattr(action, "sub_actions", None)
    return "+".join(map(str, parts)) if parts else str(action)


def torch_table(cls_name: str, ranks: int, microbatches: int, chunks: int = 1) -> list[list[str]]:
    """torch's private schedule table (`pipeline_order`), read without processes: per rank, its
    compute steps as strings in our notation (torch's idle slots dropped).

    Built as torch's `_schedule_visualizer.get_schedule_ops` builds it, from mock stages, but
    without its check that multi-stage classes have two stages per rank: they also run with
    one (zb-h1 against ScheduleInterleavedZeroBubble)."""
    from unittest import mock
    from torch.distributed.pipelining import PipelineStage, schedules
    cls = getattr(schedules, cls_name)
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, ranks, None
    stage.num_stages = ranks * chunks
    if issubclass(cls, schedules.PipelineScheduleSingle):
        if chunks != 1:
            raise ValueError(f"{cls_name} runs one stage per rank, not {chunks}")
        order = cls(stage, microbatches).pipeline_order
    else:
        order = cls([stage] * chunks, microbatches).pipeline_order
    return [[_text(a) for a in order[rank] if _computes(a)] for rank in range(ranks)]
