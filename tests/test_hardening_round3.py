"""Hardening, third round (issue 36): a user's broken model is caught, not trained; every refusal
names the rule and the parameter; no size or count takes long to refuse; make test holds on a
busy machine. Broken models live in tests/pipelab_test_broken.py (the workers import them)."""
from __future__ import annotations

import time
import warnings

import pytest

import pipelab as pl
from pipelab.runtime.exactness import InexactRunWarning
from pipelab.runtime.spec import prepare_run

pytestmark = pytest.mark.timeout(300)

BROKEN = "pipelab_test_broken"
SCHED = pl.schedule("1f1b", ranks=2, microbatches=4)


def custom(layers="layers", loss="loss", batch="batch") -> pl.CustomModel:
    return pl.CustomModel(f"{BROKEN}:{layers}", f"{BROKEN}:{loss}", f"{BROKEN}:{batch}")


def cpu_refused(call, *needles: str, within: float = 0.1) -> str:
    """The ValueError `call` raises within `within` seconds of this process's CPU time (a busy
    machine stretches wall time, not CPU time), with every needle in its message."""
    began = time.process_time()
    with pytest.raises(ValueError) as info:
        call()
    took = time.process_time() - began
    assert took < within, f"took {took * 1e3:.0f} ms of CPU time"
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- 1. a broken custom model is caught -------------------------------------------------------
@pytest.mark.parametrize("names, needles", [
    (dict(layers="pid_layers"), ["pid_layers", "layer 0 in another process", "process id"]),
    (dict(layers="repeated_layers"), ["same module object as layers 1 and 3"]),
    (dict(batch="unseeded_batch"), ["different data on two calls", "manual_seed(seed)"]),
    (dict(batch="fixed_batch"), ["ignores its seed", "seeds 0 and 1"]),
    (dict(batch="nan_batch"), ["inputs with NaN"]),
    (dict(loss="summed_loss"), ["average", "ratio 4", "reduction='mean'"]),
    (dict(loss="nan_loss"), ["is nan", "NaN or infinite loss"]),
])
def test_broken_custom_models_refused_before_workers(names, needles):
    with pytest.raises(ValueError) as info:
        prepare_run(SCHED, ranks=2, model=custom(**names))
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_the_good_model_passes_the_checks():
    prepare_run(SCHED, ranks=2, model=custom())
    assert custom().inexact() == []


def test_a_failed_gradient_check_is_loud(clusters):
    # Doubles its input only in a worker: no check before the run can see it.
    with pytest.warns(InexactRunWarning, match=r"NOT EXACT.*stage 0 \(rank 0, layers 0..2\)"
                                               r".*likely causes"):
        res = clusters(2).run(SCHED, model=custom(layers="worker_scaled_layers"), progress=False)
    assert any("likely causes" in why for why in res.inexact)
    assert "NOT EXACT: gradients differ" in res.table()


@pytest.mark.parametrize("layers, advice", [
    ("dropout_layers", "seed the dropout per microbatch"),
    ("batchnorm_layers", "use GroupNorm or LayerNorm"),
])
def test_inexact_by_design_said_before_and_marked(clusters, layers, advice):
    with pytest.warns(InexactRunWarning, match="will NOT be EXACT") as said:
        res = clusters(2).run(SCHED, model=custom(layers=layers), progress=False)
    assert advice in str(said[0].message)
    assert f"NOT EXACT: layer 2" in res.table() and advice in res.table()


def test_an_exact_custom_run_says_nothing(clusters):
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactRunWarning)
        res = clusters(2).run(SCHED, model=custom(), progress=False)
    assert res.inexact == [] and "NOT EXACT" not in res.table()
    assert res.max_grad_error < 1e-4


# --- 2. messages that name the right thing ----------------------------------------------------
def test_mesh_message_counts_the_tensor_shards():
    lazy = pl.LocalCluster(4, start=False)
    msg = cpu_refused(lambda: lazy.run(SCHED, model=pl.ModelConfig(n_layers=2, d_model=16,
                                                                   n_heads=2, seq_len=8),
                                       data_parallel=2, tensor_parallel=2),
                      "× 2 tensor-parallel shards = 8 processes", "LocalCluster(ranks=8)",
                      within=1.0)
    assert "= 4 processes" not in msg and lazy.pids == []


def test_write_errors_name_the_target_not_the_temporary_file(tmp_path, monkeypatch):
    import errno
    import os
    from pipelab.support import atomic
    target = tmp_path / "run.json"
    target.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "new")
    assert info.value.filename == str(target) and ".tmp" not in str(info.value)
    assert "unchanged" in str(info.value) and target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]       # no temporary left


def test_recomputation_of_a_custom_model_is_accepted_as_documented():
    assert "recomputation (a stage's layers re-run" in pl.LocalCluster.run.__doc__
    spec = prepare_run(SCHED, ranks=2, model=custom(), recompute="full")
    assert spec.recompute


# --- 3. a ValueError naming the parameter, not a raw exception --------------------------------
def test_raw_exceptions_become_value_errors(tmp_path, monkeypatch):
    shape = pl.ModelShape(hidden=1024, layers=8, heads=8, seq_len=512, vocab=1000)
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
    cpu_refused(lambda: pl.plan(shape, devices=4, memory_per_device=80e9, schedules=["stp"]),
                "schedules: stp cannot be planned")
    cpu_refused(lambda: pl.plan(cfg, devices=2, memory_per_device=2**30, calibration="cal"),
                "calibration must be None")
    cpu_refused(lambda: pl.ToyGPT("cfg"), "ToyGPT(cfg): cfg must be a pl.ModelConfig")
    vector = pl.CustomModel("pipelab_test_custom:layers", "pipelab_test_custom:vector_loss",
                            "pipelab_test_custom:batch")
    with pytest.raises(ValueError, match=r"vector_loss\(output, targets\) must return a scalar"):
        pl.plan(vector, devices=2, memory_per_device=2**30)
    (tmp_path / "h3_syntax.py").write_text("def layers(seed:\n    pass\n")
    (tmp_path / "h3_raises.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cpu_refused(lambda: pl.CustomModel.from_module("h3_syntax"),
                "module 'h3_syntax' failed to import: SyntaxError (line 1)", within=1.0)
    cpu_refused(lambda: pl.CustomModel.from_module("h3_raises"),
                "module 'h3_raises' failed to import: RuntimeError: no GPU here", within=1.0)
    cpu_refused(lambda: pl.CustomModel("os:_exit", "os:_exit", "os:_exit"),
                "os:_exit is a built-in function")


def test_cli_bad_models_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    (tmp_path / "h3_syntax.py").write_text("def layers(seed:\n    pass\n")
    repo = Path(__file__).resolve().parent.parent
    for argv, needle in [(["--model", "h3_syntax"], "SyntaxError (line 1)"),
                         (["--model", "os:_exit", "--loss", "_exit", "--batch", "_exit"],
                          "is a built-in function")]:
        out = subprocess.run([sys.executable, "-m", "pipelab", "run", *argv], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300,
                             env={"PYTHONPATH": f"{repo}:{tmp_path}", "OMP_NUM_THREADS": "1",
                                  "PATH": "/usr/bin:/bin"})
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and needle in out.stderr.splitlines()[-1]


# --- 4. a link refused in the parent ----------------------------------------------------------
def test_links_refused_in_the_parent():
    cpu_refused(lambda: pl.Link(1e308, 1e9), "latency must be at most 3600 s")
    cpu_refused(lambda: pl.Link(0, 1e-300), "bandwidth at least 1 byte/s")
    lazy = pl.LocalCluster(2, timeout=5, start=False)
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
    cpu_refused(lambda: lazy.run(SCHED, model=cfg, link=pl.Link(10, 1e9)),
                "waits 10 s on it, longer than the run's timeout of 5 s", within=1.0)
    assert lazy.pids == []


# --- 5. sizes refused by arithmetic -----------------------------------------------------------
def test_sizes_refused_in_100_ms_of_cpu():
    from pipelab.__main__ import main
    from pipelab.model.gpt import layer_costs
    huge = pl.ModelConfig(n_layers=10**9)
    cpu_refused(lambda: pl.partition(huge, 2, "params"), "above the limit of 100,000")
    cpu_refused(lambda: pl.partition(huge, 2), "above the limit of 100,000")
    cpu_refused(lambda: layer_costs(huge), "above the limit of 100,000")
    lazy = pl.LocalCluster(2, start=False)
    cpu_refused(lambda: lazy.run(SCHED, steps=10**9), "steps=1000000000 is above the limit")
    began = time.process_time()
    with pytest.raises(SystemExit) as info:
        main(["run", "--steps", str(10**9)])
    assert info.value.code == 2 and time.process_time() - began < 0.1


# --- 6. files ---------------------------------------------------------------------------------
def test_from_csv_of_a_missing_file(tmp_path):
    cpu_refused(lambda: pl.Schedule.from_csv(str(tmp_path / "plan.csv")),
                "from_csv: the file", "does not exist")
    cpu_refused(lambda: pl.Schedule.from_csv(tmp_path / "nothing"), "does not exist")
    assert pl.Schedule.from_csv("0F0,0B0").ranks == 1          # CSV text is still read


def test_a_symlink_planted_by_another_user_is_not_followed(tmp_path):
    import os
    from pipelab.support import atomic
    if os.geteuid() != 0:
        pytest.skip("planting a link owned by another user needs root (lchown)")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)                       # like /tmp: sticky, world-writable
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = shared / "run.json"
    link.symlink_to(victim)
    os.lchown(link, 54321, 54321)                  # another user's link
    with pytest.raises(PermissionError, match="symbolic link another user left"):
        atomic.write_text(link, "new")
    assert victim.read_text() == "precious"
    os.lchown(link, os.geteuid(), os.getegid())    # our own link: followed, the link stays
    atomic.write_text(link, "new")
    assert victim.read_text() == "new" and link.is_symlink()


def test_cli_full_disk_at_the_trace_is_one_line(tmp_path, capsys):
    import errno
    import types
    from pipelab.__main__ import _report

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    result = types.SimpleNamespace(table=lambda: "the table",
                                   timeline=types.SimpleNamespace(to_chrome_trace=full))
    code = _report(result, types.SimpleNamespace(trace=str(tmp_path / "run.json")))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "No space left on device" in err[0] and "unchanged" in err[0]


# --- 7. values no longer ignored --------------------------------------------------------------
def test_unchecked_values_refused():
    from pipelab.__main__ import main
    lazy = pl.LocalCluster(2, start=False)
    cpu_refused(lambda: lazy.run(SCHED, progress="no"), "progress must be True or False")
    cpu_refused(lambda: pl.Device(name="x", peak_flops=1e12, source=5), "Device.source")
    cpu_refused(lambda: pl.Costs.from_shape(1024, 8, 8, 512, 1000, 1, 2,
                                            sequence_parallel="yes"),
                "sequence_parallel must be True or False")
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
    cpu_refused(lambda: pl.plan(cfg, devices=2, memory_per_device=2**30, gpus_per_node=0),
                "gpus_per_node must be a positive integer")
    cpu_refused(lambda: pl.Schedule.from_text("# name=x microbatch=2\n0F0 0B0\n"),
                "unknown header key 'microbatch'")
    text = pl.schedule("1f1b", ranks=2, microbatches=2).to_text()
    assert pl.Schedule.from_text(text).microbatches == 2        # its own header still reads
    with pytest.raises(SystemExit) as info:
        main(["run", "--trace", ""])
    assert info.value.code == 2


# --- 9. your own model where the docs promise it ----------------------------------------------
GOOD = pl.CustomModel("pipelab_test_custom:layers", "pipelab_test_custom:loss",
                      "pipelab_test_custom:batch")     # Embedding, LayerNorm: not all Linear


def test_custom_partitions_by_method_and_ranges(clusters):
    res = clusters(2).run(pl.schedule("zb-h1", ranks=2, microbatches=4), model=GOOD,
                          partition="cost", progress=False)
    assert res.spec.partition_name == "cost" and res.max_grad_error < 1e-4
    table = res.table()
    # zero bubble on layers that are not all nn.Linear: the table says how much W defers
    share, fused = GOOD.deferred_share()
    assert 0 < share < 1 and f"W (deferred weight gradients): {share:.0%}" in table
    assert "the rest come with I (layer 0: table (Embedding); layer 7: norm (LayerNorm))" in table
    res = clusters(2).run(SCHED, model=GOOD, partition="0-2|3-7", progress=False)
    assert res.spec.bounds == [(0, 3), (3, 8)] and "W (deferred" not in res.table()
    from pipelab.sim.costs import Costs
    fitted = Costs.fit(res)
    assert fitted == Costs.fit(res.timeline, res.schedule.stages, res.comm_latency)


def test_cli_partitions_a_custom_model(capsys):
    from pipelab.__main__ import main
    assert main(["run", "--model", "pipelab_test_custom", "--partition", "0|1-7",
                 "--microbatches", "2"]) == 0
    assert "stages [0,1) [1,8) (custom)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["run", "--model", "pipelab_test_custom", "--partition", "0-3|3-7"])
    assert info.value.code == 2
    assert "cover layers 0..7 in order" in capsys.readouterr().err


def test_measure_runs_a_custom_plan(clusters):
    from pipelab.planner import check as plan_check
    cal = pl.calibrate(GOOD, repeats=1, warmup=1)
    plan = pl.plan(GOOD, devices=2, memory_per_device=10**12, calibration=cal, batch_size=8,
                   schedules=["1f1b"], microbatches=[4])
    c = next(c for c in plan if c.pipeline == 2)
    assert f"bounds={c.bounds!r}" in repr(c)                # the split, shown
    row = plan_check.measure(c, plan, clusters(2), steps=1)
    assert row["run"].spec.bounds == [tuple(b) for b in c.bounds]
    assert row["measured_time"] > 0


def test_critical_path_prints_as_a_table():
    tl = pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=2), pl.Costs(F=1, B=2, comm=0.5))
    path = tl.critical_path()
    text = repr(path)
    lines = text.splitlines()
    assert lines[0].startswith(f"critical path: {len(path)} steps")
    assert len(lines) == len(path) + 2 and "Event(" not in text
    assert str(path[0].event.action) in lines[2]


# --- 10. make test keeps going and reports both halves ----------------------------------------
def test_make_test_runs_the_notebooks_after_failed_unit_tests(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    repo = Path(__file__).resolve().parent.parent
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls"
    # A stand-in pytest: logs its arguments; the unit tests' first part fails.
    (bin_ / "pytest").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                                 f"case \"$*\" in *'not timing'*) exit 1;; esac\nexit 0\n")
    (bin_ / "pytest").chmod(0o755)
    (bin_ / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "python").chmod(0o755)
    stamp = tmp_path / "stamp"
    stamp.touch()
    out = subprocess.run(["make", "-s", "-C", str(repo), "test", f"BIN={bin_}",
                          f"STAMP={stamp}"], capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    assert out.returncode != 0
    assert any("-m timing" in c for c in calls)              # the unit target went on
    assert any("notebooks/" in c for c in calls)             # and so did the notebooks
    assert "make test: unit tests FAILED, notebooks passed" in out.stdout
