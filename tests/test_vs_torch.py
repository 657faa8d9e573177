"""The module-path call into the workers, and torch.distributed.pipelining on pipelab's stages
(what benchmarks/vs_torch.py relies on to compare the two runtimes honestly)."""
from __future__ import annotations

import time

import inspect

import pytest
import torch

import pipelab as pl
from pipelab.bench.torch_side import make_job, torch_table
from pipelab.runtime.result import reference_check
from pipelab.runtime.spec import prepare_run

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)
TORCH_STEP = "pipelab.bench.torch_side:run_step"


@pytest.fixture(scope="module")
def cluster():
    with pl.LocalCluster(2, timeout=60) as c:
        yield c


def test_call_runs_a_named_function_on_every_rank(cluster):
    assert cluster.call("os:getpid") == cluster.pids
    assert cluster.call("torch.distributed:get_rank") == [0, 1]     # inside the gloo group
    assert cluster.call("builtins:divmod", 7, 2) == [(3, 1), (3, 1)]
    assert cluster.call(torch.distributed.get_world_size) == [2, 2]  # a function object


@pytest.mark.parametrize("target,needle", [
    ("no_such_module_xyz:run", "cannot import module 'no_such_module_xyz'"),
    ("os:no_such_function", "has no 'no_such_function'"),
    ("os.path", "is not 'package.module:function'"),
    ("os:sep", "not a function"),
    ("__main__:helper", "defined in __main__"),
])
def test_call_refuses_what_the_workers_cannot_import(cluster, target, needle):
    starts, pids = cluster.starts, cluster.pids
    began = time.perf_counter()
    with pytest.raises(ValueError, match=needle):
        cluster.call(target)
    assert time.perf_counter() - began < 5          # refused here, nobody waited on workers
    assert cluster.starts == starts and cluster.pids == pids   # the workers were not disturbed


def test_call_refuses_a_notebook_function_and_a_lambda(cluster):
    def cell_function():
        return 1
    cell_function.__module__ = "__main__"             # as defined in a notebook cell
    cell_function.__qualname__ = "cell_function"
    with pytest.raises(ValueError, match="defined in __main__.*Move it to a module"):
        cluster.call(cell_function)
    with pytest.raises(ValueError, match="local function or a lambda"):
        cluster.call(lambda: 1)
    with pytest.raises(ValueError, match="cannot be pickled"):
        cluster.call("builtins:len", lambda: 1)       # arguments must reach the workers too
    assert cluster.call("torch.distributed:get_rank") == [0, 1]


def test_an_exception_in_a_call_names_the_rank_and_the_next_call_works(cluster):
    with pytest.raises(pl.WorkerError, match=r"rank \d raised ValueError: math domain error "
                                             r"in math:sqrt"):
        cluster.call("math:sqrt", -1.0)
    assert cluster.call("torch.distributed:get_rank") == [0, 1]   # fresh workers


def _reference(batch: int, microbatches: int, seed: int = 0):
    return prepare_run(pl.schedule("gpipe", ranks=1, microbatches=microbatches), ranks=1,
                       model=CFG, partition=[(0, CFG.total_layers)], batch_size=batch, seed=seed)


@pytest.mark.parametrize("torch_class,chunks,style", [
    ("ScheduleGPipe", 1, "loop"),
    ("ScheduleInterleaved1F1B", 2, "loop"),      # stages 0 2 on rank 0, 1 3 on rank 1
    ("ScheduleZBVZeroBubble", 2, "v"),           # stages 0 3 on rank 0, 1 2 on rank 1
])
def test_torch_schedules_on_our_stages_equal_the_unsplit_model(cluster, torch_class, chunks,
                                                               style):
    m, batch, seed = 4, 8, 3
    bounds = pl.partition(CFG, 2 * chunks).bounds
    job = make_job(torch_class, ranks=2, microbatches=m, cfg=CFG, bounds=bounds,
                   batch_size=batch, seed=seed, chunks=chunks, style=style, grads=True)
    reports = cluster.call(TORCH_STEP, job)
    grads = {name: g for rep in reports for name, g in rep["grads"].items()}
    assert len(grads) == len(list(pl.ToyGPT(CFG).parameters()))    # every layer, once
    ref_loss, max_err, _ = reference_check(_reference(batch, m, seed), grads)
    assert max_err <= 1e-5
    losses = [x for rep in reports for x in rep["losses"]]
    assert len(losses) == m
    assert sum(losses) / m == pytest.approx(ref_loss, rel=1e-6)
    kinds = 3 if torch_class == "ScheduleZBVZeroBubble" else 2      # F, I, W or F, B
    for rep in reports:
        assert rep["begin"] <= rep["end"] and rep["cpu"] > 0
        assert rep["actions"] == kinds * m * chunks


def test_torch_and_ours_give_the_same_step_on_the_same_workers(cluster):
    """The benchmark's premise: both runtimes, alternately in one process tree, same numbers."""
    m, batch = 4, 8
    sched = pl.schedule("1f1b", ranks=2, microbatches=m)
    ours = cluster.run(sched, model=CFG, batch_size=batch, progress=False)
    job = make_job("Schedule1F1B", ranks=2, microbatches=m, cfg=CFG, bounds=ours.spec.bounds,
                   batch_size=batch)
    theirs = [x for rep in cluster.call(TORCH_STEP, job) for x in rep["losses"]]
    assert theirs == pytest.approx(ours.losses, rel=1e-6)
    again = cluster.run(sched, model=CFG, batch_size=batch, progress=False)
    assert again.max_grad_error <= 1e-5          # torch's run left nothing behind


def test_torch_tables_line_up_with_ours():
    for name, cls in (("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B")):
        ours = [[str(a) for a in acts] for acts in pl.schedule(name, ranks=2, microbatches=4).actions]
        theirs = torch_table(cls, 2, 4)
        assert theirs[0] == ours[0]
        if name == "gpipe":
            assert theirs[1] == ours[1]
        else:    # torch 2.13's table numbers the last rank's forwards 1..m (its runtime does not)
            assert [a for a in theirs[1] if "B" in a] == [a for a in ours[1] if "B" in a]
            assert [a for a in theirs[1] if "F" in a] == [f"1F{i}" for i in range(1, 5)]
    zbv = torch_table("ScheduleZBVZeroBubble", 2, 4, chunks=2)
    assert sorted({int(a.split(k)[0]) for a in zbv[0] for k in "FIW" if k in a}) == [0, 3]



def _looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> pl.Schedule:
    """A stand-in for pipelab's looped-bfs (being written on another branch): each rank runs
    every forward of its first stage, then of its next, then the backwards in reverse."""
    rows = []
    for rank in range(ranks):
        mine = [rank + c * ranks for c in range(chunks)]
        rows.append([pl.Action(s, "F", mb) for s in mine for mb in range(microbatches)] +
                    [pl.Action(s, "B", mb) for s in reversed(mine) for mb in range(microbatches)])
    return pl.Schedule(rows, pl.loop_placement(ranks, chunks), microbatches, name="looped-bfs")


def test_the_benchmark_pairs_a_multi_stage_schedule_with_torch(cluster, monkeypatch, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_torch.py"
    spec = importlib.util.spec_from_file_location("vs_torch", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if "looped-bfs" not in pl.SCHEDULES:
        monkeypatch.setitem(pl.SCHEDULES, "looped-bfs", _looped_bfs)
    found = {name: (sched, cls, style) for name, sched, cls, style in bench.pairs(2, 4, 2)}
    assert {"gpipe", "1f1b", "looped-bfs"} <= set(found)
    sched, cls, style = found["looped-bfs"]
    assert (cls, style, sched.placement) == ("ScheduleLoopedBFS", "loop", (0, 1, 0, 1))
    row = bench.compare(cluster, "looped-bfs", sched, cls, style, CFG, batch=8, steps=2, warmup=0)
    assert row["err"] <= 1e-5 and row["torch_err"] <= 1e-5
    assert row["loss"] == pytest.approx(row["ref_loss"], rel=1e-6)
    assert row["torch_loss"] == pytest.approx(row["ref_loss"], rel=1e-6)
    assert row["ours_ms"] > 0 and row["torch_ms"] > 0
    bench.print_tables(sched, cls)
    out = capsys.readouterr().out
    assert "rank 1 torch: 1F0 1F1 1F2 1F3 3F0" in out        # torch's loop placement, read back


def test_call_results_carry_the_load_they_ran_at(cluster, monkeypatch):
    """A call's results say the load average when it was sent and when it came back (what any
    figure measured on this shared machine needs beside it), and still compare as a list."""
    import os
    from pipelab.support import noise
    readings = iter([1.25, 2.5])
    monkeypatch.setattr(noise, "load_average", lambda: next(readings))
    res = cluster.call("os:getpid")
    assert res == cluster.pids and res.load == (1.25, 2.5)
    line = f"measured at load average 1.25 → 2.50 on {os.cpu_count()} cores"
    assert res.load_line == line
    assert repr(res).splitlines() == [repr(cluster.pids), line]


def test_the_meter_ablations_offer_everything_the_runtime_calls_on_a_meter():
    # vs_torch.py --profile swaps the activation meter for these; one missing method crashed
    # the profile run (a TypeError deep in a worker).
    from pipelab.bench import ours_side
    from pipelab.runtime.meter import ActivationMeter
    public = {name for name in dir(ActivationMeter) if not name.startswith("_")}
    for ablation in (ours_side._NoMeter, ours_side.HooksOnlyMeter, ours_side.DetachMeter):
        assert public <= set(dir(ablation)), (ablation.__name__, public - set(dir(ablation)))
        for name in public:
            real, stand_in = getattr(ActivationMeter, name), getattr(ablation, name)
            if not callable(real):
                continue
            wanted = list(inspect.signature(real).parameters)
            took = inspect.signature(stand_in).parameters
            if not any(p.kind is p.VAR_POSITIONAL for p in took.values()):
                assert list(took) == wanted, (ablation.__name__, name, list(took), wanted)
