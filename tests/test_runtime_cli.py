"""`python -m pipelab run`: help, a tiny local run, bad input, and the same module under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8"]
OPTIONS = ["--schedule", "--ranks", "--microbatches", "--chunks", "--layers", "--d-model",
           "--heads", "--seq-len", "--batch-size", "--partition", "--steps", "--lr", "--seed",
           "--model-seed", "--timeout", "--trace", "--no-pin", "--no-check", "--recompute"]


def pipelab(*args: str, torchrun: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2"] if torchrun else [sys.executable])
    return subprocess.run([*launcher, "-m", "pipelab", "run", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def test_help_explains_every_option():
    out = pipelab("--help")
    assert out.returncode == 0
    for option in OPTIONS:
        assert option in out.stdout, option
    assert "gpipe" in out.stdout and "1f1b" in out.stdout         # the schedule names
    assert "Exit codes" in out.stdout


def test_tiny_local_run_prints_the_table_and_writes_a_trace(tmp_path):
    trace = tmp_path / "run.json"
    out = pipelab("--schedule", "gpipe", "--ranks", "2", "--microbatches", "2", *TINY,
                  "--steps", "2", "--trace", str(trace))
    assert out.returncode == 0, out.stderr
    for needle in ("measured", "replayed", "simulated", "bubble fraction", "max grad error",
                   "peak activations", "loss history"):
        assert needle in out.stdout, needle
    error = float(out.stdout.split("max grad error")[1].split()[0])
    assert error <= 1e-5
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e.get("ph") == "X" for e in events) == 2 * 2 * 2      # ranks x (F, B) x microbatches


@pytest.mark.parametrize("args,message", [
    (["--microbatches", "3", "--batch-size", "4"], "multiple of microbatches"),
    (["--schedule", "nope"], "unknown schedule"),
    (["--ranks", "0"], "ranks must be a positive integer"),
    (["--partition", "E|t|L"], "partition"),
    (["--timeout", "-1"], "timeout"),
    (["--microbatches", "many"], "invalid int value"),
    (["--trace", "/no/such/folder/run.json"], "does not exist or is not writable"),
    (["--recompute", "sometimes"], "recompute policy must be one of"),
    (["--recompute", "every-k:two"], "must be a whole number"),
])
def test_bad_input_is_a_clear_message_and_exit_code_2(args, message):
    out = pipelab(*args, *TINY)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_recompute_reaches_the_run():
    """--recompute's text becomes the run's per-stage policies (the same options reach
    prepare_run and cluster.run)."""
    from pipelab.__main__ import _build, _parser
    from pipelab.techniques.recompute import Policy
    parser, _run = _parser()
    for text, policies in [("every-k:2,none", (Policy("every-k", 2), Policy("none"))),
                           ("selective", (Policy("selective"),) * 2)]:
        args = parser.parse_args(["run", "--recompute", text, *TINY])
        _sched, _cfg, spec = _build(args, 2)
        assert spec.recompute == policies
        assert "R" in spec.schedule.kinds()


def test_the_same_module_runs_under_torchrun():
    out = pipelab("--schedule", "1f1b", "--microbatches", "4", *TINY, torchrun=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("max grad error") == 1                  # rank 0 reports, once
    assert "1f1b: 2 ranks, 4 microbatches" in out.stdout
    assert float(out.stdout.split("max grad error")[1].split()[0]) <= 1e-5
