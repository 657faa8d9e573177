"""Failure is a teaching moment, never a hang: timeouts, worker errors, deaths, Ctrl-C, cleanup."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import pipelab as pl
from pipelab.runtime.board import RUN
from pipelab.runtime.pool import WorkerPool
from pipelab.support import noise

# A broken watchdog must fail here, not hang CI; generous, as 50 runs at load 20 take minutes.
pytestmark = pytest.mark.timeout(300)

CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
TIMEOUT = 1.5
REPO = Path(__file__).resolve().parent.parent


def children() -> set[int]:
    """Live child processes of this process, except multiprocessing's resource tracker
    (started once by the spawn start method and shared by every pool)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            out.add(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def cluster():
    with pl.LocalCluster(2, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def sched():
    return pl.schedule("gpipe", ranks=2, microbatches=4)


def against_load(seconds: float, load_before: float) -> float:
    """`seconds` stretched by how many runnable processes share each core (the higher of the
    load averages before and now): a bound on how soon something is *noticed* holds on a quiet
    machine; at load 20 on two cores every process gets a tenth of a core."""
    busy = max(load_before, noise.load_average()) / (os.cpu_count() or 1)
    return seconds * max(1.0, busy)


def works(cluster, sched) -> None:
    res = cluster.run(sched, model=CFG)
    assert res.max_grad_error <= 1e-5


def test_stuck_action_times_out_naming_rank_and_action(cluster, sched):
    cluster.start()                   # the workers up before the clock starts
    load, began = noise.load_average(), time.perf_counter()
    with pytest.raises(pl.PipelineTimeout) as info:
        cluster.run(sched, model=CFG, _inject={"stall": "1F2"})
    elapsed = time.perf_counter() - began
    assert elapsed < TIMEOUT + against_load(5, load), elapsed
    err = info.value
    assert (err.rank, err.action, err.transfer) == (1, pl.Action(1, "F", 2), None)
    text = str(err)
    assert "rank 1" in text and "1F2" in text and ">1F2<" in text      # the grid, marked
    assert "rank 0 waits in 0B0" in text                                 # the victim, explained
    works(cluster, sched)


def test_lost_message_times_out_naming_the_transfer(cluster, sched):
    with pytest.raises(pl.PipelineTimeout) as info:
        cluster.run(sched, model=CFG, _inject={"drop": "0F1"})
    err = info.value
    assert err.rank == 1 and err.action == pl.Action(1, "F", 1)
    assert err.transfer.producer == pl.Action(0, "F", 1) and err.transfer.src == 0
    assert "activation 0F1->1F1" in str(err) and "lost" in str(err)
    works(cluster, sched)


def test_worker_exception_surfaces_with_its_traceback(cluster, sched):
    cluster.start()                   # the workers up before the clock starts
    old = set(cluster.pids)
    load, began = noise.load_average(), time.perf_counter()
    with pytest.raises(pl.WorkerError) as info:
        cluster.run(sched, model=CFG, _inject={"raise": "1B1"})
    assert time.perf_counter() - began < against_load(5, load)
    err = info.value
    assert err.rank == 1 and err.action == pl.Action(1, "B", 1)
    assert "Traceback (most recent call last)" in err.traceback
    assert "injected failure in 1B1" in str(err) and "executor.py" in str(err)
    assert not any(alive(pid) for pid in old)          # every worker reaped
    works(cluster, sched)
    assert not set(cluster.pids) & old                 # fresh workers


def test_killed_worker_is_detected_within_five_seconds(cluster, sched):
    cluster.start()                   # the workers up, their pids known, before any timing
    pid, stall = cluster.pids[1], sched.actions[1].index(pl.Action(1, "F", 2))
    board = cluster._pool.board
    killed_at, load = [], noise.load_average()

    def kill_rank_1() -> None:
        # Kill rank 1 once it is stuck in 1F2 (not a second after a start that may be slow).
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            state = board.read()[1]
            if state.state == RUN and state.position == stall:
                break
            time.sleep(0.02)
        killed_at.append(time.perf_counter())
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    try:
        with pytest.raises(pl.WorkerError) as info:
            cluster.run(sched, model=CFG, timeout=60, _inject={"stall": "1F2"})
        detected = time.perf_counter() - killed_at[0]
    finally:
        killer.join()
    assert detected < against_load(5, load), detected
    assert info.value.rank == 1 and info.value.exitcode == -signal.SIGKILL
    assert info.value.action == pl.Action(1, "F", 2)
    assert "killed by signal 9" in str(info.value)
    works(cluster, sched)


def test_bad_input_fails_before_any_process_starts():
    before = children()
    lazy = pl.LocalCluster(2, start=False)
    s2 = pl.schedule("1f1b", ranks=2, microbatches=4)
    broken = pl.Schedule([[pl.Action(0, "F", 0)], [pl.Action(1, "F", 0), pl.Action(1, "B", 0)]],
                         placement=(0, 1), microbatches=1)
    cases = [
        (dict(schedule=pl.schedule("1f1b", ranks=3, microbatches=3)), "ranks"),
        (dict(batch_size=6), "batch_size"),
        (dict(partition=[(0, 2), (2, 3), (3, 4)]), "partition"),
        (dict(partition="E|t*2|L"), "partition"),
        (dict(model=pl.ModelConfig(n_layers=2, tie_embeddings=True)), "tie_embeddings"),
        (dict(model=pl.ToyGPT(CFG)), "model"),
        (dict(model=pl.ModelConfig(vocab_size=8)), "vocab_size"),
        (dict(seed=1.5), "seed"),
        (dict(steps=0), "steps"),
        (dict(lr=-1), "lr"),
        (dict(timeout=0), "timeout"),
        (dict(schedule="1f1b"), "schedule"),
        (dict(_inject={"freeze": "0F0"}), "_inject"),
        (dict(_inject={"stall": "5F0"}), "_inject"),
    ]
    for kwargs, word in cases:
        kwargs = {"schedule": s2, "model": CFG, **kwargs}
        with pytest.raises(ValueError, match=word):
            lazy.run(**kwargs)
    with pytest.raises(pl.ScheduleError, match="never runs the backward"):
        lazy.run(broken, model=CFG)
    assert lazy.pids == [] and children() == before
    with pytest.raises(ValueError, match="ranks"):
        pl.LocalCluster(0)


def test_bad_input_leaves_a_running_pool_untouched(cluster, sched):
    pids = cluster.pids
    with pytest.raises(ValueError, match="batch_size"):
        cluster.run(sched, model=CFG, batch_size=3)
    assert cluster.pids == pids
    works(cluster, sched)


def test_no_child_left_after_close_and_none_leaked_over_50_runs(sched):
    before = children()
    fds = len(os.listdir("/proc/self/fd"))
    cluster = pl.LocalCluster(2)
    workers = set(cluster.pids)
    assert children() - before == workers
    small = pl.schedule("1f1b", ranks=2, microbatches=2)
    for _ in range(50):
        cluster.run(small, model=CFG, check=False)
    assert children() - before == workers                 # the same two workers, nothing else
    cluster.close()
    assert not any(alive(pid) for pid in workers)
    assert children() == before
    assert len(os.listdir("/proc/self/fd")) <= fds + 2     # pipes closed too
    works(cluster, sched)                                  # a closed cluster starts again
    cluster.close()
    assert children() == before


CTRL_C = textwrap.dedent("""
    import os, signal, threading, time
    import pipelab as pl

    if __name__ == "__main__":
        # As at a terminal: a suite started in the background inherits SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cluster = pl.LocalCluster(2, timeout=60)
        pids = cluster.pids
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        began = time.perf_counter()
        try:
            cluster.run(pl.schedule("gpipe", ranks=2, microbatches=2),
                        model=pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8),
                        _inject={"stall": "1F1"})
        except KeyboardInterrupt:
            dead = all(not os.path.exists(f"/proc/{p}") or
                       open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
                       for p in pids)
            print("interrupted", round(time.perf_counter() - began, 1), "workers dead:", dead)
""")


def test_ctrl_c_stops_the_workers_and_reraises(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert "workers dead: True" in out.stdout, out.stdout + out.stderr


def test_a_pool_that_cannot_start_in_time_is_reaped():
    before = children()
    with pytest.raises(pl.WorkerError, match="did not start"):
        WorkerPool(2, start_timeout=0.01)
    assert children() == before
