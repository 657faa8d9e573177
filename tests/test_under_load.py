"""The load harness's parsing, aggregation and busy loops (no notebook is run here)."""
from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("under_load", REPO / "benchmarks" / "under_load.py")
under_load = importlib.util.module_from_spec(spec)
sys.modules["under_load"] = under_load        # dataclasses look their module up there
spec.loader.exec_module(under_load)

# What nbval printed for a notebook whose cell 1 failed an assert and cell 2 failed inside a
# function (colours included, as pytest writes them to a pipe with nbval's own ANSI codes).
NBVAL_OUTPUT = """.FF                                                                      [100%]
=================================== FAILURES ===================================
______________________________ fail.ipynb::Cell 1 ______________________________
\x1b[91mNotebook cell execution failed\x1b[0m
\x1b[94mCell 1: Cell execution caused an exception

Input:
\x1b[0my = 2
assert x + y == 4, f'sum {x + y}'
print('no')

\x1b[94mTraceback:\x1b[0m

\x1b[31m---------------------------------------------------------------------------\x1b[39m
\x1b[31mAssertionError\x1b[39m                            Traceback (most recent call last)
\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[1]\x1b[39m\x1b[32m, line 2\x1b[39m
\x1b[32m      1\x1b[39m y = \x1b[32m2\x1b[39m
\x1b[32m----> \x1b[39m\x1b[32m2\x1b[39m \x1b[38;5;28;01massert\x1b[39;00m x + y == \x1b[32m4\x1b[39m, \x1b[33mf'sum {x + y}'\x1b[39m
\x1b[32m      3\x1b[39m print(\x1b[33m'no'\x1b[39m)

\x1b[31mAssertionError\x1b[39m: sum 3

______________________________ fail.ipynb::Cell 2 ______________________________
\x1b[91mNotebook cell execution failed\x1b[0m
\x1b[94mCell 2: Cell execution caused an exception

\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[1]\x1b[39m\x1b[32m, line 3\x1b[39m
\x1b[32m----> \x1b[39m\x1b[32m3\x1b[39m f()

\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[1]\x1b[39m\x1b[32m, line 2\x1b[39m, in \x1b[36mf\x1b[39m\x1b[34m()\x1b[39m
\x1b[32m----> \x1b[39m\x1b[32m2\x1b[39m     \x1b[38;5;28;01massert\x1b[39;00m \x1b[38;5;28;01mFalse\x1b[39;00m

\x1b[31mAssertionError\x1b[39m: 

=========================== short test summary info ============================
FAILED fail.ipynb::Cell 1 - \x1b[91mNotebook cell execution failed\x1b[0m
FAILED fail.ipynb::Cell 2 - \x1b[91mNotebook cell execution failed\x1b[0m
2 failed, 1 passed in 3.16s
"""

PYTEST_OUTPUT = """F.                                                                       [100%]
=================================== FAILURES ===================================
__________________________________ test_ratio __________________________________

    def test_ratio():
        ratio = 1.32
>       assert ratio < 1.3, f"balance {ratio}"
E       AssertionError: balance 1.32
E       assert 1.32 < 1.3

tests/test_x.py:3: AssertionError
=========================== short test summary info ============================
FAILED tests/test_x.py::test_ratio - AssertionError: balance 1.32
1 failed, 1 passed in 0.02s
"""


def test_failures_name_the_cell_the_line_and_the_error():
    assert under_load.failures(NBVAL_OUTPUT) == [
        "cell 1: assert x + y == 4, f'sum {x + y}' (AssertionError: sum 3)",
        "cell 2: assert False (AssertionError:)"]       # the innermost line, not the call f()
    assert under_load.failures(PYTEST_OUTPUT) == [
        'test_ratio: assert ratio < 1.3, f"balance {ratio}" (AssertionError: balance 1.32)']


def test_a_cell_timeout_is_named_as_such():
    body = ("______ n.ipynb::Cell 11 ______\nTimeout of 120 seconds exceeded executing cell\n"
            "----> 3 res = cluster.run(sched)\nKeyboardInterrupt: \n")
    assert under_load.failures(body) == [
        "cell 11: Timeout of 120 seconds exceeded executing cell "
        "(interrupted at: res = cluster.run(sched))"]


def test_summary_counts_passes_hangs_and_failures_per_run():
    Outcome = under_load.Outcome
    s = under_load.Summary("05_zero_bubble", [
        Outcome(True, 30.0), Outcome(False, 50.0, failures=["cell 14: a (AssertionError)"] * 2),
        Outcome(False, 40.0, failures=["cell 14: a (AssertionError)", "cell 3: b (E)"]),
        Outcome(False, 90.0, hung=True, failures=["no result within 90 s (hang)"])])
    assert (s.passes, s.hangs, s.wall()) == (1, 1, (45.0, 30.0, 90.0))
    # a failure seen twice in one run counts that run once
    assert s.failing() == {"cell 14: a (AssertionError)": 2, "cell 3: b (E)": 1,
                           "no result within 90 s (hang)": 1}
    text = under_load.table([s], nbconvert=True)
    row = text.splitlines()[2]
    assert re.search(r"05_zero_bubble\s+1 / 4\s+45\.0 \(30\.0–90\.0\)\s+1$", row), row
    assert "    2× cell 14: a (AssertionError)" in text


def test_commands_use_the_makefile_nbval_flags():
    makefile = (REPO / "Makefile").read_text()
    target = makefile.split("\nnotebooks:")[1].split("\n\n")[0]
    assert "PIPELAB_CI=1" in target
    cmd = under_load.command(Path("notebooks/01.ipynb"), tests=False, nbconvert=False, outdir="x")
    for flag in re.findall(r"(--nbval\S+|-p no:\S+)", target):
        assert " ".join(cmd).count(flag) == 1, flag
    tests = under_load.command(Path("tests/test_x.py"), tests=True, nbconvert=False, outdir="x")
    assert not any(f.startswith("--nbval") for f in tests)
    nbconvert = under_load.command(Path("n.ipynb"), tests=False, nbconvert=True, outdir="out")
    assert nbconvert[-6:] == ["--execute", "--to", "notebook", "--output-dir", "out", "n.ipynb"]
    assert under_load.environment(REPO)["PIPELAB_CI"] == "1"


@pytest.mark.parametrize("argv, message", [
    (["--runs", "0"], "--runs must be at least 1"),
    (["--busy", "-1"], "--busy must be 0"),
    (["--timeout", "0"], "--timeout must be positive"),
    (["--tests", "tests/test_noise.py", "--nbconvert"], "--tests runs pytest files"),
    (["--repo", "/"], "--repo must be a pipelab checkout"),
])
def test_bad_options_are_refused_before_anything_runs(argv, message):
    with pytest.raises(ValueError, match=message):
        under_load.parse_args(argv)


def test_busy_loops_are_killed_also_when_the_block_raises():
    with pytest.raises(KeyboardInterrupt):
        with under_load.busy_loops(2) as procs:
            time.sleep(0.2)
            assert len(procs) == 2 and all(p.poll() is None for p in procs)   # spinning
            raise KeyboardInterrupt
    assert all(p.poll() is not None for p in procs)                         # reaped


def test_a_run_past_its_timeout_is_killed_and_counts_as_a_hang(tmp_path):
    began = time.perf_counter()
    outcome = under_load.run_once(["sleep", "30"], tmp_path, timeout=0.5)
    assert outcome.hung and not outcome.passed and time.perf_counter() - began < 10
