"""engine="torch": a schedule run by torch.distributed.pipelining's own runtime, in our workers.

    res = cluster.run(sched, model=cfg, engine="torch")          # exact, measured, like ours
    res = cluster.run(sched, model=cfg, engine="torch", torch_trace="traces/")

The parent exports the schedule with `Schedule.to_torch_csv()` (which refuses what torch cannot
express) and ships the text in the RunSpec. Each rank builds its stages exactly as our runtime
does (`RankStages`: the same layers, weights and parameter names), wraps each in a torch
`PipelineStage`, loads the file into a `_PipelineScheduleRuntime` (`_load_csv`, which lowers it
to torch's compute+comms program and infers the stage placement from it) and calls its `step`.
Torch splits each backward into I and W itself (autograd's `stage_backward_input/weight`), scales
the gradients by 1/m and computes the loss on the last stage with the model's own loss function.

Timing: torch's runtime brackets every action it runs in `record_function("PP:<action>")` and
waits for an action's received inputs in `_wait_batch_p2p`. For the duration of a step this
module stands in for both names in torch's `schedules` module (calling the originals, so a
profiler still sees torch's regions) and reads the clocks around them: per compute action its
span, the receive wait at its start kept apart (as our executor keeps it), and thread CPU time
after the wait. An overlapped pair `(0F3;3B1)OVERLAP_F_B` is one event; its waits are moved to
its start. The events are matched one to one, in order, against the schedule's actions of the
rank: a run whose torch program differs from the schedule fails loudly.

What torch's engine does not do here: activation metering (peaks read 0), and the techniques
that are ours (data, tensor and expert parallelism, recomputation, an emulated link), refused
before any worker starts (`check_options`).

`torch_trace=DIR`: each rank also records its last step with torch.profiler (CPU) and writes
`DIR/rank<r>.json`, a Chrome trace holding torch's `PP:<action>` regions (the input of
`pl.Timeline.from_torch_trace`); the profiler slows the step it records.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..schedules.torch_format import torch_cell
from .board import DONE, OPTIM, RUN, SETUP, SYNC, NoBoard
from ..model.weight_grad import Linear as DeferrableLinear
from .stage import RankStages

#: The runtimes `cluster.run(engine=...)` knows.
ENGINES = ("pipelab", "torch")

#: What a torch run would silently drop: run options of ours torch's runtime has no part in,
#: each with what to do instead.
UNSUPPORTED = {
    "data_parallel": ("torch's runtime here runs one pipeline; replicate it with torch's "
                  "DDP/FSDP around the stages (TorchTitan's --parallelism."
                  "data_parallel_shard_degree), or run data_parallel on engine='pipelab'"),
    "tensor_parallel": ("shard the blocks with torch's DTensor tensor parallelism inside each "
                  "stage, or run tensor_parallel on engine='pipelab'"),
    "expert_parallel": ("use torch's expert parallelism inside the stage modules, or run "
                  "expert_parallel on engine='pipelab'"),
    "recompute": ("wrap the stage modules in activation checkpointing "
                  "(torch.utils.checkpoint) instead, or run recompute on engine='pipelab'"),
    "link": ("an emulated link is our runtime's: run it on engine='pipelab'"),
    "inject": ("the failure-injection hooks are our executor's"),
}


def check_engine(engine) -> str:
    """`engine` if it is a known runtime, else ValueError."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: a run goes on 'pipelab' (our runtime, the "
                         f"default) or 'torch' (torch.distributed.pipelining's "
                         f"_PipelineScheduleRuntime, from the exported schedule)")
    return engine


def check_options(**options) -> None:
    """ValueError naming every run option torch's engine does not support, with what to do."""
    bad = [(name, value) for name, value in options.items() if not _default(name, value)]
    if bad:
        lines = "; ".join(f"{name}={value!r}: {UNSUPPORTED[name]}" for name, value in bad)
        raise ValueError(f"engine='torch' does not support {', '.join(n for n, _ in bad)} "
                         f"(torch's runtime would run without it): {lines}")


def _default(name: str, value) -> bool:
    if name == "recompute":
        return value in (None, "none")
    if name in ("link", "inject"):
        return not value
    return value == 1


def export(schedule) -> str:
    """The schedule as torch's compute-only CSV; ValueError for one torch cannot express, or
    one its runtime would stop inside a step."""
    text = schedule.to_torch_csv()
    last = schedule.stages - 1
    order = [part.microbatch for item in schedule.actions[schedule.rank_of(last)]
             for part in item.parts if part.stage == last and part.kind == "F"]
    if order != sorted(order):
        raise ValueError(f"schedule {schedule.name!r}: its last stage {last} runs its forwards "
                         f"in the microbatch order {order}; torch's runtime keeps the losses in "
                         f"the order they were computed and looks microbatch k's up at "
                         f"position k, so it needs them in order 0..{schedule.microbatches - 1}: "
                         f"run it on engine='pipelab', or reorder those forwards")
    return text


def check_batch(model, batch_size: int, seed: int) -> None:
    """torch's `step` splits one tensor of inputs and one of targets into microbatches: a
    model whose batch parts are tuples is refused here."""
    inputs, targets = next(iter(model.batches(batch_size, seed)))
    for part, value in (("inputs", inputs), ("targets", targets)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"engine='torch' needs the model's batch {part} as one tensor "
                             f"(torch's step splits one tensor per argument into microbatches), "
                             f"got a {type(value).__name__}; run it on engine='pipelab'")


def check_trace_dir(path) -> Path:
    """`torch_trace=`: a directory this process can create and write (checked before a run)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"torch_trace={path!r}: give a directory path for the ranks' traces")
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"torch_trace={path!r}: cannot create the directory ({err})") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"torch_trace={path!r}: the directory is not writable")
    return folder


def trace_paths(folder, ranks: int) -> list[Path]:
    """Where `torch_trace=folder` puts each rank's trace."""
    return [Path(folder) / f"rank{r}.json" for r in range(ranks)]


# --- in the worker ----------------------------------------------------------------------------------
class _Clock:
    """Stands in for `record_function` and `_wait_batch_p2p` in torch's schedules module while
    a step runs, recording each PP region: (text, waited_from, start, end, cpu)."""

    def __init__(self, real_region, real_wait, board, rank: int, compute: set):
        self.real_region, self.real_wait = real_region, real_wait
        self.board, self.rank, self.compute = board, rank, compute
        self.records: list[tuple] = []
        self.step = 0
        self.waited = 0.0                      # seconds blocked in receives, this region
        self.cpu_waited = 0.0
        self.positions = 0

    def region(self, name, *args, **kwargs):
        return _Region(self, name, self.real_region(name, *args, **kwargs))

    def wait(self, work):
        t, c = time.perf_counter(), time.thread_time()
        out = self.real_wait(work)
        self.waited += time.perf_counter() - t
        self.cpu_waited += time.thread_time() - c
        return out


class _Region:
    __slots__ = ("clock", "name", "inner", "t0", "c0")

    def __init__(self, clock: _Clock, name: str, inner):
        self.clock, self.name, self.inner = clock, name, inner

    def __enter__(self):
        clock = self.clock
        if self.name in clock.compute:
            clock.board.set(clock.rank, clock.step, clock.positions, RUN)
        self.inner.__enter__()
        clock.waited = clock.cpu_waited = 0.0
        self.c0, self.t0 = time.thread_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        end, c1 = time.perf_counter(), time.thread_time()
        clock = self.clock
        if self.name in clock.compute:
            clock.records.append((self.name, self.t0, self.t0 + clock.waited, end,
                                  c1 - self.c0 - clock.cpu_waited))
            clock.positions += 1
        return self.inner.__exit__(*exc)


def plain_linears(stages: RankStages) -> RankStages:
    """`stages` with each of our deferrable Linears (model/weight_grad.py) made a plain
    nn.Linear again, in place (same Parameters, bit-equal arithmetic): torch splits I and W
    with autograd.grad, which through our Function would compute each weight GEMM in I too and
    drop it (W computes it again), while nn.Linear's backward skips what is not asked for."""
    for module in stages.modules.values():
        for m in module.modules():
            if type(m) is DeferrableLinear:
                m.__class__ = torch.nn.Linear
    return stages


class _Packed(torch.nn.Module):
    """A stage for torch: torch hands a stage the tensors of a tuple its neighbour sent as
    separate arguments; our layers take the tuple (a custom model's (hidden, ids) boundary)."""

    def __init__(self, layers: torch.nn.Module):
        super().__init__()
        self.layers = layers

    def forward(self, *args):
        return self.layers(args[0] if len(args) == 1 else args)


def run_rank(spec, rank: int, board=None, notify=None) -> dict:
    """Every training step of `spec` on torch's runtime as pipeline rank `rank`; a report in
    the executor's layout (executor.run_rank), which `result.assemble` reads."""
    from torch.distributed.pipelining import PipelineStage, schedules
    board = board or NoBoard()
    board.set(rank, 0, 0, SETUP)
    sched = spec.schedule
    mine = sched.stages_of(rank)
    stages = plain_linears(RankStages(spec.cfg, spec.bounds, mine))
    model = spec.model
    pipe = [PipelineStage(_Packed(stages.modules[s]), s, sched.stages, torch.device("cpu"))
            for s in sorted(mine)]
    runtime = schedules._PipelineScheduleRuntime(pipe, sched.microbatches, loss_fn=model.loss)
    with tempfile.TemporaryDirectory(prefix="pipelab-torch-") as folder:
        path = os.path.join(folder, "schedule.csv")
        with open(path, "w") as f:
            f.write(spec.torch_csv)
        runtime._load_csv(path)
    first, last = 0 in mine, sched.stages - 1 in mine
    ours = list(sched.actions[rank])
    texts = [torch_cell(item) for item in ours]
    clock = _Clock(schedules.record_function, schedules._wait_batch_p2p, board, rank,
                   {f"PP:{t}" for t in texts})
    producers = _producers(sched)
    params = stages.parameters()
    optimizer = torch.optim.AdamW(params, lr=spec.lr) if spec.steps > 1 else None
    batches = model.batches(spec.batch_size, spec.seed)
    report = {"rank": rank, "coords": (rank, 0), "shard": 0, "pid": os.getpid(), "steps": [],
              "grads": None, "engine": "torch",
              "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
              "reduced_bytes": {s: sum(p.numel() * p.element_size() for p in m.parameters())
                                for s, m in stages.modules.items()}}
    traced = getattr(spec, "torch_trace", None)
    for k in range(spec.steps):
        inputs, targets = next(batches)
        stages.zero_grad()
        losses: list = []
        profiler = None
        if traced is not None and k == spec.steps - 1:
            from torch.profiler import ProfilerActivity, profile
            profiler = profile(activities=[ProfilerActivity.CPU])
        clock.records, clock.positions, clock.step = [], 0, k
        board.set(rank, k, 0, SYNC)
        dist.barrier()                             # every rank starts together, as ours do
        if profiler is not None:
            profiler.__enter__()
        schedules.record_function, schedules._wait_batch_p2p = clock.region, clock.wait
        try:
            c0, begin = time.thread_time(), time.perf_counter()
            runtime.step(*((inputs,) if first else ()), target=targets if last else None,
                         losses=losses if last else None, return_outputs=False)
            end, cpu = time.perf_counter(), time.thread_time() - c0
        finally:
            schedules.record_function, schedules._wait_batch_p2p = clock.real_region, clock.real_wait
            if profiler is not None:
                profiler.__exit__(None, None, None)
        if profiler is not None:
            profiler.export_chrome_trace(str(trace_paths(traced, sched.ranks)[rank]))
        report["steps"].append(_step_report(ours, texts, clock.records, producers, sched,
                                            begin, end, cpu, losses))
        if k == 0 and spec.check:
            report["grads"] = stages.gradients()
        if notify is not None and last:
            notify(k, sum(float(x.detach()) for x in losses) / sched.microbatches)
        if optimizer is not None and k < spec.steps - 1:
            board.set(rank, k, len(ours), OPTIM)
            optimizer.step()
    board.set(rank, spec.steps - 1, len(ours), DONE)
    return report


def _producers(sched) -> dict:
    """{(stage, microbatch, "F" or "B"): the part computing it}: who sends what a part waits
    for (a forward's input comes from the previous stage's F, a backward's from the next
    stage's B or I)."""
    out = {}
    for acts in sched.actions:
        for item in acts:
            for part in item.parts:
                if part.kind == "F":
                    out[(part.stage, part.microbatch, "F")] = part
                elif part.kind in ("B", "I"):
                    out[(part.stage, part.microbatch, "B")] = part
    return out


def _step_report(ours, texts, records, producers, sched, begin, end, cpu, losses) -> dict:
    """The executor's step layout from the PP regions: one action per record, checked one to
    one against the schedule's actions of the rank, in order."""
    got = [name[3:] for name, *_ in records]
    if got != texts:
        at = next((i for i, (a, b) in enumerate(zip(got, texts)) if a != b),
                  min(len(got), len(texts)))
        raise RuntimeError(f"torch's runtime ran {len(got)} compute actions on this rank, the "
                           f"schedule has {len(texts)}; they differ from position {at}: torch "
                           f"{got[at:at + 3]}, the schedule {texts[at:at + 3]}")
    actions, recvs = [], []
    for i, (item, (_name, waited_from, start, stop, c)) in enumerate(zip(ours, records)):
        actions.append((i, item, waited_from, start, stop, max(c, 0.0), 0))
        if len(item.parts) == 1 and start > waited_from:
            part = item.parts[0]
            src = producers.get((part.stage - 1, part.microbatch, "F")) if part.kind == "F" \
                else producers.get((part.stage + 1, part.microbatch, "B"))
            if src is not None:
                recvs.append((src, item, sched.rank_of(src.stage), waited_from, start))
    return {"begin": begin, "end": end, "cpu": cpu, "actions": actions, "recvs": recvs,
            "sends": [], "memory": [(begin, 0)],
            "losses": {mb: float(x.detach()) for mb, x in enumerate(losses)},
            "peak": 0, "action_peaks": [0] * len(actions), "inside": [],
            "send_peak": 0, "offloaded_peak": 0}
