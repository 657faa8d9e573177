"""`python -m pipelab run --data-parallel 2`: locally and under torchrun (env://), 4 processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8"]


def pipelab(*args: str, nproc: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc)] if nproc else [sys.executable])
    return subprocess.run([*launcher, "-m", "pipelab", "run", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def check(out) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("max grad error") == 1
    assert "1f1b × dp 2: 2 ranks, 4 microbatches" in out.stdout
    assert "mesh 2 pipeline ranks × 2 data-parallel replicas = 4 processes" in out.stdout
    assert "pp 1 / dp 1: 1AR" in out.stdout
    assert float(out.stdout.split("max grad error")[1].split()[0]) <= 1e-5


def test_data_parallel_runs_from_the_command_line():
    check(pipelab("--schedule", "1f1b", "--microbatches", "4", "--data-parallel", "2", *TINY))


def test_the_same_mesh_under_torchrun():
    check(pipelab("--schedule", "1f1b", "--microbatches", "4", "--data-parallel", "2", *TINY,
                  nproc=4))


@pytest.mark.parametrize("args,message", [
    (["--data-parallel", "2", "--batch-size", "12"], "multiple of data_parallel × microbatches"),
    (["--data-parallel", "0"], "data_parallel must be a positive integer"),
])
def test_a_bad_mesh_is_a_clear_message(args, message):
    out = pipelab("--microbatches", "4", *args, *TINY)
    assert out.returncode == 2 and message in out.stderr, out.stderr
