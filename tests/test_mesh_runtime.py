"""Data × pipeline parallelism live: a 2 × 2 grid of worker processes, exact against the
unsplit model on the whole batch; faults on the mesh name the process by its coordinates."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import pipelab as pl
from pipelab.techniques import reduction_of

pytestmark = pytest.mark.timeout(240)

CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
TIMEOUT = 3.0


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def mesh():
    # Healthy runs get a generous timeout (group setup on a loaded 2-core machine can take
    # seconds); the fault tests pass their short TIMEOUT.
    with pl.LocalCluster(ranks=4, timeout=60) as cluster:
        yield cluster
    assert not any(alive(p) for p in cluster.pids)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_two_by_two_is_exact_against_the_unsplit_model(mesh, name):
    res = mesh.run(pl.schedule(name, ranks=2, microbatches=4), model=CFG, data_parallel=2)
    assert res.max_grad_error <= 1e-5
    assert abs(res.loss - res.reference_loss) <= 1e-5 * abs(res.reference_loss)
    assert res.spec.batch_size == 16 and len(res.losses) == 8      # 2 replicas × 4 microbatches
    assert set(res.process_timelines) == {(0, 0), (1, 0), (0, 1), (1, 1)}
    for (pp, dp), tl in res.process_timelines.items():
        assert [str(e.action) for e in tl.comm_events()] == [f"{pp}AR"]
        assert {e.rank for e in tl.events} == {pp}
    # Replica 0's pipeline is the main timeline, its all-reduces on the communication lane.
    assert [str(e.action) for e in res.timeline.comm_events()] in (["1AR", "0AR"], ["0AR", "1AR"])
    assert all(t > 0 for times in res.reduction_times().values() for t in times.values())
    assert reduction_of(1) in {e.action for e in res.replay.events}


def test_training_on_the_grid_matches_single_process_training(mesh):
    # The optimizer steps after every reduction is waited for: the replicas stay identical and
    # follow the single-process loss curve on the whole batch.
    steps, batch = 4, 16
    res = mesh.run(pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2),
                   model=pl.ModelConfig(n_layers=4, d_model=16, n_heads=2, seq_len=8),
                   steps=steps, batch_size=batch, lr=1e-2, seed=5, progress=False,
                   data_parallel=2)
    single = pl.train(pl.ModelConfig(n_layers=4, d_model=16, n_heads=2, seq_len=8), steps=steps,
                      batch_size=batch, lr=1e-2, seed=5, progress=False)
    assert res.loss_history == pytest.approx(single, rel=1e-5)
    assert res.loss_history[-1] < res.loss_history[0]
    assert res.max_grad_error <= 1e-5


def test_a_stuck_all_reduce_names_the_process_and_the_replica_that_never_came(mesh):
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    mesh.start()
    began = time.perf_counter()
    with pytest.raises(pl.PipelineTimeout) as info:
        mesh.run(sched, model=CFG, data_parallel=2, _inject={"stall": "1AR", "replica": 1},
                 timeout=TIMEOUT)
    assert time.perf_counter() - began < TIMEOUT + 5
    message = str(info.value)
    assert "pp 1 / dp 0 waits in all-reduce of stage 1's gradients (1AR)" in message
    assert "dp 1 never reached it" in message
    assert info.value.rank == 3                    # the process at (pp 1, dp 1)


def test_a_lost_message_in_one_replica_is_named_in_its_coordinates(mesh):
    sched = pl.schedule("gpipe", ranks=2, microbatches=4)
    with pytest.raises(pl.PipelineTimeout) as info:
        mesh.run(sched, model=CFG, data_parallel=2, _inject={"drop": "0F1", "replica": 1},
                 timeout=TIMEOUT)
    message = str(info.value).splitlines()[0]
    # Replica 0 waits in its all-reduces; the cause is replica 1's lost activation.
    assert "dp 1 never reached it, because in dp 1: pp 1 / dp 1 made no progress" in message
    assert "0F1->1F1 from pp 0 / dp 1" in message and "message was lost" in message
    assert info.value.rank == 3


def test_a_worker_exception_names_its_coordinates(mesh):
    mesh.start()                                   # (fresh workers after the last failure)
    old = set(mesh.pids)
    began = time.perf_counter()
    with pytest.raises(pl.WorkerError) as info:
        mesh.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, data_parallel=2,
                 _inject={"raise": "0B1", "replica": 1}, timeout=TIMEOUT)
    assert time.perf_counter() - began < TIMEOUT + 5
    assert str(info.value).startswith("pp 0 / dp 1 (process 2) raised RuntimeError")
    assert info.value.rank == 2 and info.value.action == pl.Action(0, "B", 1)
    assert not any(alive(p) for p in old)


def test_a_killed_worker_is_named_and_everyone_reaped(mesh):
    mesh.start()
    old = list(mesh.pids)
    killed_at = []

    def kill() -> None:
        time.sleep(1.0)
        killed_at.append(time.perf_counter())
        os.kill(old[3], signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        with pytest.raises(pl.WorkerError) as info:
            mesh.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, data_parallel=2,
                     timeout=60, _inject={"stall": "1F2", "replica": 1})
        detected = time.perf_counter() - killed_at[0]
    finally:
        killer.join()
    assert detected < 5, detected
    assert info.value.rank == 3 and str(info.value).startswith("pp 1 / dp 1 (process 3) died")
    assert not any(alive(p) for p in old)
    res = mesh.run(pl.schedule("gpipe", ranks=2, microbatches=2), model=CFG, data_parallel=2)
    assert res.max_grad_error <= 1e-5          # fresh workers, the next run works


def test_two_replicas_of_a_one_stage_pipeline():
    with pl.LocalCluster(ranks=2, timeout=10) as cluster:
        res = cluster.run(pl.schedule("gpipe", ranks=1, microbatches=2), model=CFG,
                          data_parallel=2)
        pids = cluster.pids
    assert res.max_grad_error <= 1e-5
    assert [str(a) for a in res.schedule.actions[0]][-1] == "0AR"
    assert not any(alive(p) for p in pids)


CTRL_C = """
import os, signal, threading, time
import pipelab as pl

if __name__ == "__main__":
    # As at a terminal: a suite started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster = pl.LocalCluster(4, timeout=60)
    pids = cluster.pids
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        cluster.run(pl.schedule("1f1b", ranks=2, microbatches=2), data_parallel=2,
                    model=pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8),
                    _inject={"stall": "1AR", "replica": 1})
    except KeyboardInterrupt:
        dead = all(not os.path.exists(f"/proc/{p}") or
                   open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
                   for p in pids)
        print("interrupted; workers dead:", dead)
"""


def test_ctrl_c_in_a_stuck_all_reduce_stops_every_process(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    script = tmp_path / "ctrl_c_mesh.py"
    script.write_text(CTRL_C)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=180, env=env)
    assert "interrupted; workers dead: True" in out.stdout, out.stdout + out.stderr
