"""pipelab's own executor, instrumented, run inside LocalCluster workers:

    cluster.call("pipelab.bench.ours_side:run_step", spec, profile=True)   # one dict per rank

It runs `run_rank(spec)` exactly as a `cluster.run` does (measuring on: per-action clocks,
activation meter, progress board) and adds what a run does not report: this thread's CPU time
from the end of the step's barrier to the end of the step, and optionally a cProfile of that
span. The step ends when the executor's `_run_step` returns (its sends waited), as torch's side
ends when `step()` returns: what `run_rank` does after the step (dropping the rank's stages,
~1% of a small step) is not part of it. Both ends are found by wrapping `torch.distributed.
barrier` and the executor's `_run_step` for the duration of the call: no hook in the executor.
A spec of engine="torch" runs torch's runtime on the exported schedule through the same call
(run_rank hands it to runtime/torch_engine.py), measured from the same barrier.
"""
from __future__ import annotations

import time

from ..runtime.board import Board, NoBoard
from ..runtime.executor import run_rank
from ..runtime import executor
from .profiling import profiler as make_profiler, summarize
from ..runtime.calls import resolve


def run_step(spec, profile: bool = False, without: tuple = (), meter: str | None = None) -> dict:
    """`without`: parts of the measuring to switch off for an ablation ("meter", "board");
    `meter`: 'module:Class' of another activation meter to measure with."""
    import torch.distributed as dist
    from multiprocessing import RawArray
    rank = dist.get_rank()
    marks: list[float] = []
    profiler = None
    if profile:
        profiler = make_profiler()
    barrier = dist.barrier

    def timed_barrier(*args, **kwargs):
        out = barrier(*args, **kwargs)
        marks.append(time.thread_time())
        if profiler is not None:
            profiler.enable()
        return out

    run_step_of = executor._run_step
    ends: list[float] = []

    def timed_step(*args, **kwargs):
        out = run_step_of(*args, **kwargs)
        ends.append(time.thread_time())
        if profiler is not None:
            profiler.disable()
        return out

    dist.barrier = timed_barrier
    executor._run_step = timed_step
    meter_class = executor.ActivationMeter
    if "meter" in without:
        executor.ActivationMeter = _NoMeter
    elif meter is not None:                  # A/B another meter design in the same workers
        executor.ActivationMeter = resolve(meter)
    try:
        board = Board(RawArray("d", 5 * dist.get_world_size()), dist.get_world_size())
        if "board" in without:
            board = NoBoard()
        report = run_rank(spec, rank, board)   # a board like the pool's: measuring on
    finally:
        executor.ActivationMeter = meter_class
        if profiler is not None:
            profiler.disable()
        dist.barrier = barrier
        executor._run_step = run_step_of
    step = report["steps"][-1]
    # engine="torch" (runtime/torch_engine.py) never enters our _run_step: its step report
    # holds the thread CPU from the end of the barrier to the end of torch's step itself
    cpu = ends[-1] - marks[-1] if ends else step["cpu"]
    out = {"rank": rank, "begin": step["begin"], "end": max(a[4] for a in step["actions"]),
           "cpu": cpu, "actions": len(step["actions"]),
           "handler_cpu": sum(a[5] for a in step["actions"])}
    if profiler is not None:
        out["profile"] = summarize(profiler)
    return out


class _NoMeter:
    """Ablation: an activation meter that measures nothing (every method the runtime calls is
    a no-op, every figure 0)."""
    live = peak = sending = sending_peak = offloaded = offloaded_peak = 0

    def __init__(self, parameters=(), sample=None):
        pass

    def saving(self, keep=None):
        import contextlib
        return contextlib.nullcontext()

    def count_saved(self, tensor):
        return tensor

    def _ignore(self, *args) -> None:
        pass

    hold = drop = add_parameters = remove_parameters = hold_send = _ignore
    sends_done = reset_peak = begin = end = _ignore


class HooksOnlyMeter(_NoMeter):
    """Ablation: saved-tensor hooks that do nothing (pack and unpack return the tensor): the
    floor any hook-based meter pays. Leaks a graph that never runs backward; in a pipeline
    step every forward's graph is consumed by its backward."""

    def saving(self, keep=None):
        import torch
        return torch.autograd.graph.saved_tensors_hooks(_same, _same)


class DetachMeter(_NoMeter):
    """Ablation: hooks that keep a detached alias of each saved tensor, and count nothing."""

    def saving(self, keep=None):
        import torch
        return torch.autograd.graph.saved_tensors_hooks(_detached, _same)


def _same(tensor):
    return tensor


def _detached(tensor):
    return tensor.detach()
