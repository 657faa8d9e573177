"""engine="torch": our schedules, exported, run by torch's _PipelineScheduleRuntime in our workers.

Exact against the unsplit model (toy GPT and a CustomModel whose stage boundary is a tuple with
an integer tensor), one measured event per action in the schedule's order on each rank, the
receive waits kept out of the events (a consumer never starts before its producer ended), the
same training as our runtime over two AdamW steps, torch.profiler traces holding the same
actions, and bad input refused before any worker starts. One cluster serves the whole file.
"""
from __future__ import annotations

import json

import pytest

import pipelab as pl
from pipelab.schedules.torch_format import torch_cell

TOL = 1e-5
CFG = pl.ModelConfig(n_layers=2, d_model=32, n_heads=2, seq_len=8)
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v",
             "v-half", "v-min", "zb-auto", "dualpipe-v"]
CUSTOM = pl.CustomModel(layers="pipelab_test_custom:layers", loss="pipelab_test_custom:loss",
                        batch="pipelab_test_custom:batch")


@pytest.fixture(scope="module")
def cluster():
    with pl.LocalCluster(2, timeout=60) as c:
        yield c


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _check(res, sched) -> None:
    """Exact, and one event per action in the schedule's order, each after its inputs."""
    assert res.spec.engine == "torch"
    assert res.max_grad_error <= TOL, res.grad_errors
    assert _relative(res.loss, res.reference_loss) <= TOL
    ended = {}
    for rank in range(sched.ranks):
        events = sorted(res.timeline.events_of(rank), key=lambda e: e.start)
        assert [e.action for e in events] == list(sched.actions[rank])
        for a, b in zip(events, events[1:]):
            assert a.start <= a.end <= b.start + 1e-9          # one action at a time per rank
        for e in events:
            for part in e.action.parts:
                ended[part] = e.end
    # A plain action of a stage whose input comes from another rank starts after its producer
    # ended: the receive wait is not part of the event (torch's F waits inside its PP region).
    checked = 0
    for rank in range(sched.ranks):
        for e in res.timeline.events_of(rank):
            if len(e.action.parts) > 1 or e.action.kind == "W":
                continue
            a = e.action
            source = (a.stage - 1, "F") if a.kind == "F" else (a.stage + 1, None)
            if not 0 <= source[0] < sched.stages or sched.rank_of(source[0]) == rank:
                continue
            producer = [p for p in ended if p.stage == source[0] and p.microbatch == a.microbatch
                        and (p.kind == "F" if a.kind == "F" else p.kind in ("B", "I"))]
            assert len(producer) == 1
            assert e.start >= ended[producer[0]] - 1e-4, (e, producer)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", SCHEDULES)
def test_torch_runs_our_schedule_exactly(cluster, name):
    sched = pl.schedule(name, ranks=2, microbatches=4)
    res = cluster.run(sched, model=CFG, engine="torch", progress=False)
    _check(res, sched)
    assert res.table()                                   # the usual summary reads it
    assert res.simulated.makespan > 0 and res.replay.makespan > 0


@pytest.mark.parametrize("name", ["1f1b", "zb-v"])
def test_a_custom_model_with_a_tuple_boundary(cluster, name):
    sched = pl.schedule(name, ranks=2, microbatches=4)
    res = cluster.run(sched, model=CUSTOM, engine="torch", progress=False)
    assert not all(b.plain for b in res.spec.boundaries.values())    # a (hidden, ids) tuple
    _check(res, sched)


def test_two_steps_train_as_our_runtime_does(cluster):
    sched = pl.schedule("zb-h1", ranks=2, microbatches=4)
    ours = cluster.run(sched, model=CFG, steps=3, progress=False)
    theirs = cluster.run(sched, model=CFG, steps=3, engine="torch", progress=False)
    assert len(theirs.loss_history) == 3
    assert theirs.loss_history[-1] < theirs.loss_history[0]
    for a, b in zip(theirs.loss_history, ours.loss_history):
        assert _relative(a, b) <= 1e-4


def test_torch_trace_holds_the_same_actions(cluster, tmp_path):
    sched = pl.schedule("dualpipe-v", ranks=2, microbatches=4)
    res = cluster.run(sched, model=CFG, engine="torch", torch_trace=tmp_path / "tr",
                      progress=False)
    _check(res, sched)
    for rank in range(2):
        trace = json.loads((tmp_path / "tr" / f"rank{rank}.json").read_text())
        want = {f"PP:{torch_cell(a)}" for a in sched.actions[rank]}
        regions = sorted((e["ts"], e["name"]) for e in trace["traceEvents"]
                         if e.get("ph") == "X" and e.get("name") in want)
        assert [name for _ts, name in regions] == [f"PP:{torch_cell(a)}"
                                                   for a in sched.actions[rank]]


# --- refused before any worker starts ------------------------------------------------------------
@pytest.fixture()
def idle():
    c = pl.LocalCluster(2, start=False)
    yield c
    assert c.pids == []                                  # nothing was started
    c.close()


@pytest.mark.parametrize("options, words", [
    ({"engine": "tensorflow"}, ["engine='tensorflow'", "'pipelab'", "'torch'"]),
    ({"engine": "torch", "recompute": "full"}, ["recompute", "checkpoint"]),
    ({"engine": "torch", "link": pl.Link(latency=1e-4, bandwidth=1e9)}, ["link"]),
    ({"engine": "torch", "_inject": {"raise": "0F0"}}, ["inject"]),
    ({"torch_trace": "somewhere"}, ["torch_trace", "engine='torch'"]),
])
def test_bad_input_is_refused(idle, options, words):
    with pytest.raises(ValueError) as err:
        idle.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, **options)
    for word in words:
        assert word in str(err.value)


def test_data_and_tensor_parallel_are_refused_with_what_to_do(idle):
    with pytest.raises(ValueError) as err:
        idle.run(pl.schedule("1f1b", ranks=1, microbatches=4), model=CFG, engine="torch",
                 data_parallel=2)
    assert "data_parallel" in str(err.value) and "DDP" in str(err.value)
    with pytest.raises(ValueError) as err:
        idle.run(pl.schedule("1f1b", ranks=1, microbatches=4), model=CFG, engine="torch",
                 tensor_parallel=2, expert_parallel=1)
    assert "tensor_parallel" in str(err.value)


@pytest.mark.parametrize("name", ["pipedream", "vocab-1"])
def test_a_schedule_torch_cannot_express_is_refused(idle, name):
    sched = pl.schedule(name, ranks=2, microbatches=4)
    with pytest.raises(ValueError) as err:
        idle.run(sched, model=CFG, engine="torch")
    with pytest.raises(ValueError) as direct:             # the exporter's own reason
        sched.to_torch_csv()
    assert str(err.value) == str(direct.value)


def test_a_last_stage_out_of_microbatch_order_is_refused(idle):
    """torch's runtime looks microbatch k's loss up at position k of the losses computed: it
    would stop inside the step ("Loss for microbatch 1 is not available")."""
    sched = pl.Schedule.from_csv("0F0,0F1,0B0,0B1\n1F1,1F0,1B0,1B1\n", name="backwards")
    sched.to_torch_csv()                                 # torch can express it...
    with pytest.raises(ValueError, match=r"microbatch order \[1, 0\]"):
        idle.run(sched, model=CFG, engine="torch")      # ...but not run it


def test_the_benchmark_runs_the_same_order_on_both_runtimes(cluster):
    """benchmarks/vs_torch.py's 'same order, two runtimes' table: every schedule torch can
    express, each run by both runtimes in the same workers, both exact."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_torch.py"
    spec = importlib.util.spec_from_file_location("vs_torch_same_order", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    names = [s.name for s in bench.exportable(2, 4, 2)]
    assert set(SCHEDULES) <= set(names) and "pipedream" not in names and "vocab-1" not in names
    for name in ("1f1b", "dualpipe-v"):
        row = bench.same_order(cluster, pl.schedule(name, ranks=2, microbatches=4), CFG,
                               batch=8, steps=2, warmup=0)
        assert max(row["err"], row["torch_err"], row["loss_err"], row["torch_loss_err"]) <= TOL
        assert row["ours_ms"] > 0 and row["torch_ms"] > 0 and row["torch_cpu"] > 0


@pytest.mark.parametrize("torchrun", [False, True])
def test_the_cli_runs_on_torch_locally_and_under_torchrun(torchrun):
    from test_runtime_cli import TINY, pipelab
    out = pipelab("--engine", "torch", "--schedule", "dualpipe-v", "--microbatches", "4", *TINY,
                  torchrun=torchrun, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("max grad error") == 1
    assert "run by torch's _PipelineScheduleRuntime" in out.stdout
    assert float(out.stdout.split("max grad error")[1].split()[0]) <= TOL
    bad = pipelab("--engine", "torch", "--schedule", "pipedream", "--microbatches", "4", *TINY)
    assert bad.returncode == 2 and "torch" in bad.stderr
