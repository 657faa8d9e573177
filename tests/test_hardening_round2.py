"""Hardening, second round (issue 21): no silent misread, impossible sizes refused in under a
second with the bytes needed and available, fault messages that name the right process by its
mesh coordinates, files written whole or not at all, nothing left in TMPDIR."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pipelab as pl
from pipelab.support import atomic
from pipelab.model import footprint
from pipelab.runtime.mesh import Mesh
from pipelab.runtime import rendezvous
from pipelab.runtime.board import RECV, RUN, SETUP, SYNC, RankState
from pipelab.runtime.errors import WorkerError
from pipelab.runtime.meshwatch import diagnose_mesh
from pipelab.runtime.spec import prepare_run
from pipelab.runtime.watchdog import diagnose, stalled
from pipelab.schedules import comm_plan

pytestmark = pytest.mark.timeout(120)

CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
SCHED = pl.schedule("1f1b", ranks=2, microbatches=4)


def refused(call, *needles: str, within: float = 1.0) -> str:
    """The ValueError `call` raises, quickly, with every needle in its message."""
    began = time.perf_counter()
    with pytest.raises(ValueError) as info:
        call()
    took = time.perf_counter() - began
    assert took < within, f"took {took:.2f} s"
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- silent misreads -------------------------------------------------------------------------
def synthetic(cfg=CFG):
    from pipelab.planner.calibrate import flop_shares
    n = cfg.total_layers
    w, core = flop_shares(cfg)
    return pl.Calibration(cfg, ((1e-3, 1e-4),) * n, ((2e-3, 2e-4),) * n, w, core, latency=0.0,
                          bandwidth=1e9, overhead=0.0)


@pytest.mark.parametrize("option, value, needle", [
    ("microbatches", 0, "microbatches must be a list or tuple"),      # was "every divisor"
    ("microbatches", 5, "microbatches must be a list or tuple"),      # was a TypeError
    ("microbatches", (0,), "microbatches must hold positive integers"),   # ZeroDivisionError
    ("microbatches", (-2,), "microbatches must hold positive integers"),  # "no candidate"
    ("chunks", (0,), "chunks must hold positive integers"),   # dropped the interleaved ones
    ("chunks", (-1,), "chunks must hold positive integers"),
    ("chunks", 2, "chunks must be a list or tuple"),                   # was a TypeError
    ("schedules", "1f1b", "the single string '1f1b'"),     # read letter by letter
])
def test_plan_refuses_candidate_lists_it_would_misread(option, value, needle):
    refused(lambda: pl.plan(CFG, devices=2, memory_per_device=2**30, calibration=synthetic(),
                            batch_size=8, **{option: value}), needle)


def test_plan_says_when_no_microbatch_count_divides_the_batch():
    refused(lambda: pl.plan(CFG, devices=2, memory_per_device=2**30, calibration=synthetic(),
                            batch_size=8, microbatches=(3,)), "microbatches=[3]")


def test_plan_refuses_a_million_layers_quickly():
    # No calibration given: the layers must be refused before any is built or measured.
    refused(lambda: pl.plan(pl.ModelConfig(n_layers=10**6), devices=8, memory_per_device=2**30),
            "layers", "above the limit of 512")


def test_pin_must_be_a_bool():
    refused(lambda: pl.LocalCluster(2, pin="no", start=False), "pin must be True or False")


@pytest.mark.parametrize("batch_size", [0, -1, 2.5])
def test_partition_batch_size_must_be_a_positive_integer(batch_size):
    refused(lambda: pl.partition(CFG, 2, "cost", batch_size=batch_size),
            "batch_size must be a positive integer")


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1"])
def test_partition_layer_times_must_be_seconds(bad):
    times = [1.0] * CFG.total_layers
    times[2] = bad
    refused(lambda: pl.partition(CFG, 2, "cost", layer_times=times), "layer_times",
            "layer 2 has")


def test_layer_times_give_every_method_its_measured_loads():
    # Not ignored by uniform and params (refusing it would break the comparison notebook 01
    # draws): the split follows the method, the times loads follow the measurements.
    times = [4.0, 1.0, 1.0, 1.0]
    for method in ("uniform", "params"):
        parts = pl.partition(CFG, 2, method, layer_times=times)
        assert parts.times == [sum(times[a:b]) for a, b in parts.bounds]
        assert parts.bounds == pl.partition(CFG, 2, method).bounds


def test_partition_names_a_config_that_is_not_one():
    refused(lambda: pl.partition("model"), "cfg must be a pl.ModelConfig", "str")


def test_top_k_needs_experts():
    refused(lambda: pl.ModelConfig(top_k=5), "ModelConfig.top_k=5", "n_experts")
    assert pl.ModelConfig(n_experts=8, top_k=5).top_k == 5


def test_schedule_name_must_be_a_string():
    refused(lambda: pl.schedule(["1f1b"], ranks=2, microbatches=4),
            "name must be one schedule's name as a str", "list")


def test_a_header_placement_that_names_idle_stages_is_reported_as_the_placement():
    text = pl.schedule("gpipe", ranks=1, microbatches=2).to_text()
    bad = text.replace("placement=0", "placement=0,0,0")
    refused(lambda: pl.Schedule.from_text(bad), "placement 0,0,0 has 3 stages",
            "stage(s) [1, 2] have no action")
    short = pl.schedule("1f1b", ranks=2, microbatches=2).to_text().replace(
        "placement=0,1", "placement=0")
    refused(lambda: pl.Schedule.from_text(short), "placement 0 has 1 stage(s)", "stage 1")


# --- sizes that cannot fit ---------------------------------------------------------------------
@pytest.mark.parametrize("config, batch_size", [
    (dict(n_layers=10**9), None),
    (dict(vocab_size=10**8), None),
    (dict(d_ff=10**8), None),
    (dict(seq_len=10**6), None),
    (dict(), 2**30),
])
def test_a_run_that_cannot_fit_is_refused_in_under_a_second(config, batch_size):
    cfg = pl.ModelConfig(**{**CFG.as_dict(), **config})
    refused(lambda: prepare_run(SCHED, ranks=2, model=cfg, batch_size=batch_size),
            "this run needs at least", "bytes", "available (MemAvailable")


def test_a_model_that_cannot_fit_is_not_built():
    refused(lambda: pl.ToyGPT(pl.ModelConfig(vocab_size=10**10)),
            "building layers [0, 6)", "parameters", "available")


def test_the_check_compares_with_the_memory_available(monkeypatch):
    """A small run passes; the same run is refused once the machine has less memory than its
    lower bound, with both figures."""
    needs = sum(footprint.run_needs(CFG, processes=2, replicas=1, microbatches=4,
                                    batch_size=8).values())
    prepare_run(SCHED, ranks=2, model=CFG)
    monkeypatch.setattr(footprint, "available_bytes", lambda: needs - 1)
    refused(lambda: prepare_run(SCHED, ranks=2, model=CFG), f"{needs:,} bytes",
            f"{needs - 1:,} bytes")
    monkeypatch.setattr(footprint, "available_bytes", lambda: needs)
    prepare_run(SCHED, ranks=2, model=CFG)


def test_a_schedule_text_of_a_million_and_a_half_actions_is_refused_before_parsing():
    text = "0F0 " * 1_500_000
    csv = text.replace(" ", ",")
    refused(lambda: pl.Schedule.from_text(text), "more than 200,000 cells")
    refused(lambda: pl.Schedule.from_csv(csv), "more than 200,000 cells")


@pytest.mark.parametrize("timeout", [1e-6, 0.5])
def test_a_timeout_below_one_second_is_refused(timeout):
    refused(lambda: pl.LocalCluster(2, timeout=timeout, start=False), "minimum of 1 s")


# --- the command line --------------------------------------------------------------------------
def cli(*args: str, capsys) -> str:
    from pipelab.__main__ import main
    began = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        main(["run", *args])
    assert info.value.code == 2 and time.perf_counter() - began < 5
    return capsys.readouterr().err


def test_cli_refuses_300_ranks_for_the_process_count(capsys):
    err = cli("--ranks", "300", capsys=capsys).strip().splitlines()[-1]
    assert "worker processes" in err and "limit of 256" in err and "partition" not in err


def test_cli_refuses_a_trace_directory_before_running(tmp_path, capsys):
    err = cli("--trace", str(tmp_path), capsys=capsys)
    assert "is a directory" in err


def test_cli_help_names_the_schedules_that_take_chunks():
    from pipelab.__main__ import _parser
    _, run = _parser()
    text = next(a.help for a in run._actions if "--chunks" in a.option_strings)
    assert "interleaved-1f1b" in text and "zb-v" in text and "none is registered" not in text


# --- fault messages ----------------------------------------------------------------------------
def board(mesh: Mesh, rows: dict) -> list[RankState]:
    """Every process of `mesh` at rows[process] = (step, position, state, since)."""
    return [RankState(r, *rows[r][:3], 0, rows[r][3]) for r in range(mesh.size)]


class TpSpec:
    """What diagnose_mesh reads of a RunSpec: the schedule and a pp × tp mesh."""
    schedule = SCHED
    mesh = Mesh(pp=2, tp=2)


def test_a_shard_behind_its_tp_peer_is_blamed_not_the_peer_waiting_for_it():
    """pp 1 / tp 1 (process 3) still waits for its input of 1F1 while its peer pp 1 / tp 0 runs
    1F1, waiting inside it in the tensor-parallel all-reduce; stage 0's shards wait in 0B1 for
    1B1's gradient. Following only shard 0's pipeline from the longest waiter blamed the busy
    looking pp 1 / tp 0 ("computing") and named every process "dp 0"."""
    plan = comm_plan(SCHED)
    at = {str(s.action): i for r in (0, 1) for i, s in enumerate(plan[r])}
    states = board(TpSpec.mesh, {0: (0, at["0B1"], RECV, 5.0), 1: (0, at["0B1"], RECV, 6.0),
                                 2: (0, at["1F1"], RUN, 10.0), 3: (0, at["1F1"], RECV, 12.0)})
    error = diagnose_mesh(states, TpSpec, plan, 3.0, now=100.0)
    head = str(error).splitlines()[0]
    assert error.rank == 3, head
    assert "pp 1 / tp 0 waits in a tensor-parallel all-reduce inside 1F1 for pp 1 / tp 1" in head
    assert "0F1->1F1 from pp 0 / tp 1" in head
    assert "dp 0" not in str(error)                        # a pp × tp mesh has no dp axis
    assert "pp 0 / tp 1 waits in 0B1" in str(error)         # every line in coordinates


def test_a_stopped_process_is_blamed_even_when_another_waited_longer():
    states = [RankState(0, 0, 0, SETUP, 0, 10.0), RankState(1, 0, 0, SETUP, 0, 20.0)]
    plan = comm_plan(SCHED)
    assert diagnose(states, SCHED, plan, 3.0, 100.0).rank == 0          # the longest
    error = diagnose(states, SCHED, plan, 3.0, 100.0, stopped=frozenset({1}))
    assert error.rank == 1 and "rank 1 is stopped" in str(error).splitlines()[0]


def test_the_no_progress_clock_starts_after_set_up():
    """Set-up (no progress marks, seconds on a busy machine) is not a stall: only a stopped
    process, or SETUP_LIMIT, ends it; once every process is past it the timeout applies."""
    never = lambda: frozenset()                                        # noqa: E731
    setup = [RankState(0, 0, 0, SETUP, 0, 0.0), RankState(1, 0, 0, SYNC, 0, 0.0)]
    assert not stalled(setup, now=10.0, timeout=3.0, stopped=never)
    assert stalled(setup, now=10.0, timeout=3.0, stopped=lambda: frozenset({0}))
    assert stalled(setup, now=100.0, timeout=3.0, stopped=never)       # SETUP_LIMIT
    running = [RankState(0, 0, 1, RUN, 0, 0.0), RankState(1, 0, 0, RECV, 0, 0.0)]
    assert stalled(running, now=10.0, timeout=3.0, stopped=never)
    assert not stalled(running, now=2.0, timeout=3.0, stopped=never)
    # and one still setting up while the other waits at the barrier is the one named, its
    # lateness counted from when the other got there
    error = diagnose([RankState(0, 0, 0, SYNC, 0, 4.0), RankState(1, 0, 0, SETUP, 0, 6.0)],
                     SCHED, comm_plan(SCHED), 3.0, 10.0)
    head = str(error).splitlines()[0]
    assert error.rank == 1 and "rank 1 has not finished setting up its stages 6.0 s" in head


class _DeadPool:
    """A pool whose process 3 was killed while rank states are on its board."""

    def __init__(self, state: RankState):
        self.board = type("B", (), {"read": lambda _self: [state] * 4})()

    def check_alive(self):
        raise WorkerError("worker process 3 died: it was killed by signal 9", 3, exitcode=-9)

    def alive(self):
        return False


@pytest.mark.parametrize("state, where", [
    (RankState(3, 0, 0, SETUP, 0, 0.0), "while setting up, before its first action 1F0"),
    (RankState(3, 0, 0, SYNC, 0, 0.0), "at the barrier that starts the step, before 1F0"),
    (RankState(3, 0, 1, RUN, 0, 0.0), "while running 1B0 (training step 0)"),
])
def test_a_death_names_the_process_by_its_coordinates_and_says_where(state, where):
    cluster = pl.LocalCluster(4, start=False)
    cluster._pool = _DeadPool(state)
    spec = prepare_run(SCHED, ranks=4, model=CFG, data_parallel=2)
    with pytest.raises(WorkerError) as info:
        cluster._check_deaths(spec)
    cluster._pool = None
    message = str(info.value)
    assert message.startswith("pp 1 / dp 1 (process 3) died: its worker process was killed by "
                              "signal 9"), message
    assert where in message and "while before" not in message


def test_stopping_a_process_of_a_pp_by_tp_mesh_names_its_coordinates():
    """Live: SIGSTOP process 1 (pp 0 / tp 1) once it is in its second step."""
    with pl.LocalCluster(4, timeout=2) as cluster:
        victim = 1
        pid = cluster.pids[victim]

        def stop() -> None:
            while cluster._pool is not None and cluster._pool.board.read()[victim].step < 1:
                time.sleep(0.005)
            os.kill(pid, signal.SIGSTOP)

        stopper = threading.Thread(target=stop, daemon=True)
        stopper.start()
        try:
            with pytest.raises(pl.PipelineTimeout) as info:
                cluster.run(SCHED, model=CFG, tensor_parallel=2, steps=500, check=False,
                            progress=False)
        finally:
            stopper.join(5)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    first = str(info.value).splitlines()[0]
    assert first.startswith("pipeline timed out: pp 0 / tp 1 (process 1) is stopped"), first
    assert info.value.rank == victim


# --- files written whole -----------------------------------------------------------------------
def test_a_trace_write_that_fails_halfway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    old = pl.simulate(SCHED, pl.Costs(F=1.0, I=1.0, W=1.0)).to_chrome_trace(path).read_text()
    real = json.dump

    def full_disk(obj, f, **kwargs) -> None:
        f.write(json.dumps(obj)[:100])                     # part of the output, then the error
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk)
    bigger = pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=8), pl.Costs(F=1.0))
    with pytest.raises(OSError, match="No space"):
        bigger.to_chrome_trace(path)
    monkeypatch.setattr(json, "dump", real)
    assert path.read_text() == old and json.loads(old)["traceEvents"]
    assert os.listdir(tmp_path) == ["run.json"]            # no temporary file left


def test_a_csv_write_that_fails_halfway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "s.csv"
    old = SCHED.to_csv(path)
    real = os.fdopen

    class HalfWriter:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(atomic.os, "fdopen", lambda *a, **k: HalfWriter(real(*a, **k)))
    with pytest.raises(OSError, match="No space"):
        pl.schedule("gpipe", ranks=2, microbatches=8).to_csv(path)
    monkeypatch.setattr(atomic.os, "fdopen", real)
    assert path.read_text() == old
    assert os.listdir(tmp_path) == ["s.csv"]


def test_an_atomic_write_keeps_the_mode_and_the_link_of_the_file_it_replaces(tmp_path):
    path, link = tmp_path / "s.csv", tmp_path / "link.csv"
    path.write_text("old")
    path.chmod(0o640)
    link.symlink_to(path)
    SCHED.to_csv(link)                                     # written through the link
    assert link.is_symlink() and path.read_text() == SCHED.to_csv()
    assert path.stat().st_mode & 0o777 == 0o640


# --- leftovers in TMPDIR -----------------------------------------------------------------------
def test_a_killed_parents_rendezvous_directory_is_swept_by_the_next_start(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(done.stdout)                                 # a pid that has exited
    stale = tmp_path / f"{rendezvous.PREFIX}{dead}-abc123"
    live = tmp_path / f"{rendezvous.PREFIX}{os.getpid()}-def456"
    other = tmp_path / "pipelab-rdv-notapid"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "store").write_text("x")
    assert rendezvous.sweep(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


def test_workers_keep_torch_compile_caches_in_the_rendezvous_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with rendezvous.spawning(str(tmp_path)):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    with rendezvous.spawning(str(tmp_path)):                # the user's choice is kept
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"
