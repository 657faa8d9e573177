"""Run the notebooks (or test files) several times while busy loops occupy the cores.

A learner's laptop is a busy machine: what a notebook asserts must hold there. This harness
runs each chosen notebook `--runs` times under nbval, with the same flags as the Makefile's
`notebooks` target and PIPELAB_CI=1, while `--busy` processes spin at normal priority (default:
one per core; 0 = a quiet machine), and prints per notebook: passes / runs, wall time (median
and range) and the failing cells with the line that failed. The busy loops are always killed at
the end, on an error and on Ctrl-C too.

    python benchmarks/under_load.py                          # every notebook, 5 runs, K = cores
    python benchmarks/under_load.py notebooks/05_zero_bubble.ipynb --runs 3 --busy 0
    python benchmarks/under_load.py --tests tests/test_runtime.py --runs 5
    python benchmarks/under_load.py --nbconvert notebooks/09b_tensor_and_pipeline.ipynb

`--nbconvert` runs `jupyter nbconvert --execute` instead (no nbval): the way a user runs a
notebook headless, where a cell that never returns counts as a hang at `--timeout`.
`--repo` runs another checkout's notebooks and package (its own `pipelab` is imported).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

HERE = Path(__file__).resolve().parents[1]
# The Makefile's `notebooks` target (tests/test_under_load.py checks that they agree).
NBVAL_FLAGS = ["--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=120",
               "-p", "no:cacheprovider"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- options ---------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every one in notebooks/)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each target (default 5)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="busy processes while running (default: one per core; 0 = quiet)")
    parser.add_argument("--tests", nargs="+", type=Path, default=[], metavar="PATH",
                        help="pytest files to run the same way (instead of notebooks)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds one run may take before it counts as a hang (default 1800)")
    parser.add_argument("--nbconvert", action="store_true",
                        help="run `jupyter nbconvert --execute` instead of nbval")
    parser.add_argument("--repo", type=Path, default=HERE,
                        help="the checkout whose notebooks and package are run (default: this one)")
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse options that cannot make a measurement, before anything starts."""
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}")
    if args.busy < 0:
        raise ValueError(f"--busy must be 0 (quiet) or more, got {args.busy}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be positive seconds, got {args.timeout}")
    if args.tests and (args.notebooks or args.nbconvert):
        raise ValueError("--tests runs pytest files: give no notebooks and no --nbconvert with it")
    if not (args.repo / "pipelab").is_dir():
        raise ValueError(f"--repo must be a pipelab checkout (no pipelab/ in {args.repo})")


def targets(args: argparse.Namespace) -> list[Path]:
    """The files to run, relative to the repository when they are inside it."""
    chosen = args.tests or args.notebooks or sorted((args.repo / "notebooks").glob("*.ipynb"))
    missing = [p for p in chosen if not (args.repo / p).exists() and not p.exists()]
    if missing:
        raise ValueError(f"no such file: {', '.join(map(str, missing))}")
    return list(chosen)


# --- busy loops --------------------------------------------------------------------------------

@contextmanager
def busy_loops(k: int) -> Iterator[list[subprocess.Popen]]:
    """`k` processes spinning at normal priority for the duration; killed and reaped on exit,
    whatever ends the block (an error, Ctrl-C)."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(k):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                          stdin=subprocess.DEVNULL))
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


# --- one run -----------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One run of one target."""
    passed: bool
    seconds: float
    hung: bool = False
    failures: list[str] = field(default_factory=list)     # "cell 19: assert ... (AssertionError)"


def command(target: Path, *, tests: bool, nbconvert: bool, outdir: str) -> list[str]:
    """The command line of one run."""
    if nbconvert:
        return [sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "notebook",
                "--output-dir", outdir, str(target)]
    flags = [] if tests else NBVAL_FLAGS
    return [sys.executable, "-m", "pytest", "-q", "-rfEs", *flags, str(target)]


def environment(repo: Path) -> dict[str, str]:
    """PIPELAB_CI=1 as in CI, and the repository's own package first on the path."""
    env = dict(os.environ, PIPELAB_CI="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    return env


def run_once(cmd: list[str], repo: Path, timeout: float) -> Outcome:
    """Run `cmd` in its own process group; a run past `timeout` is killed (group and all: the
    kernel and any pipeline workers) and counts as a hang."""
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=environment(repo), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        return Outcome(False, time.perf_counter() - began, hung=True,
                       failures=[f"no result within {timeout:g} s (hang)"])
    except BaseException:
        _kill_group(proc)
        raise
    seconds = time.perf_counter() - began
    return Outcome(proc.returncode == 0, seconds,
                   failures=[] if proc.returncode == 0 else failures(output))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# --- reading a failed run's output ---------------------------------------------------------------

SECTION = re.compile(r"^_{3,} (.+?) _{3,}$", re.M)
POINTER = re.compile(r"^(?:-+>\s*\d+\s|>\s+)(.*)$")             # "----> 2 assert" / ">   assert"
ERROR = re.compile(r"^(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Interrupt)\b.*)$")


def failures(output: str) -> list[str]:
    """One line per failure in pytest / nbval / nbconvert output: where (the notebook cell or
    test), the line that failed and the exception, e.g.
    "cell 19: assert imbalance['cost'] < imbalance['uniform'] (AssertionError)"."""
    text = ANSI.sub("", output)
    heads = list(SECTION.finditer(text))
    if not heads:                      # nbconvert: one CellExecutionError, no pytest sections
        return [_describe("cell", text)] if "Error" in text or "Exception" in text else \
            ["failed (no error in the output)"]
    out = []
    for head, nxt in zip(heads, heads[1:] + [None]):
        name = head.group(1)
        if name.startswith(("short test summary", "warnings summary")):
            continue
        body = text[head.end(): nxt.start() if nxt else len(text)]
        body = body.split("short test summary info")[0]
        cell = re.search(r"::Cell (\d+)", name)
        out.append(_describe(f"cell {cell.group(1)}" if cell else name.split("::")[-1], body))
    return out


def _describe(where: str, body: str) -> str:
    lines = [line.rstrip() for line in body.splitlines()]
    pointed = [m.group(1).strip() for m in map(POINTER.match, lines) if m]
    errors = [m.group(1).strip() for m in map(ERROR.match, lines) if m]
    error = errors[-1] if errors else ""
    line = pointed[-1] if pointed else ""
    timeout = re.search(r"Timeout of [\d.]+ seconds exceeded[^\n.]*", body)
    if timeout:                  # nbval interrupted the kernel: say so, not KeyboardInterrupt
        return f"{where}: {timeout.group(0)} (interrupted at: {line or error})"
    return f"{where}: {line} ({error})" if line else f"{where}: {error or 'failed'}"


# --- the table ---------------------------------------------------------------------------------

@dataclass
class Summary:
    """Every run of one target."""
    name: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def passes(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def hangs(self) -> int:
        return sum(o.hung for o in self.outcomes)

    def wall(self) -> tuple[float, float, float]:
        """Median, shortest and longest wall time of the runs (seconds)."""
        times = [o.seconds for o in self.outcomes]
        return statistics.median(times), min(times), max(times)

    def failing(self) -> dict[str, int]:
        """Each distinct failure and the number of runs it happened in."""
        counts: dict[str, int] = {}
        for o in self.outcomes:
            for f in dict.fromkeys(o.failures):
                counts[f] = counts.get(f, 0) + 1
        return counts


def table(summaries: Sequence[Summary], nbconvert: bool = False) -> str:
    width = max([len(s.name) for s in summaries] + [8])
    head = f"{'target':<{width}}  {'passes':>7}  {'wall s (median, range)':>24}"
    head += f"  {'hangs':>5}" if nbconvert else ""
    lines = [head, "-" * len(head)]
    for s in summaries:
        median, low, high = s.wall()
        passes = f"{s.passes} / {len(s.outcomes)}"
        row = f"{s.name:<{width}}  {passes:>7}  {f'{median:.1f} ({low:.1f}–{high:.1f})':>24}"
        row += f"  {s.hangs:>5}" if nbconvert else ""
        lines.append(row)
        for failure, runs in s.failing().items():
            lines.append(f"{'':<{width}}    {runs}× {failure}")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        chosen = targets(args)
    except ValueError as error:
        print(f"under_load: {error}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(args.repo))
    from pipelab.support.noise import load_line
    summaries = {t: Summary(t.stem if not args.tests else str(t)) for t in chosen}
    mode = "nbconvert --execute" if args.nbconvert else ("pytest" if args.tests else "nbval")
    print(f"{mode}, {args.runs} run(s) each, {args.busy} busy loop(s); before: {load_line()}",
          flush=True)
    with tempfile.TemporaryDirectory() as outdir, busy_loops(args.busy):
        # Round by round (every target once, then again): a slow spell of the machine falls
        # on all of them rather than on one.
        for run in range(args.runs):
            for target in chosen:
                cmd = command(target, tests=bool(args.tests), nbconvert=args.nbconvert,
                              outdir=outdir)
                outcome = run_once(cmd, args.repo, args.timeout)
                summaries[target].outcomes.append(outcome)
                verdict = "pass" if outcome.passed else ("HANG" if outcome.hung else "FAIL")
                print(f"  run {run + 1}/{args.runs} {summaries[target].name}: {verdict} "
                      f"in {outcome.seconds:.1f} s ({load_line()})", file=sys.stderr, flush=True)
    print(table(list(summaries.values()), nbconvert=args.nbconvert))
    print(f"after: {load_line()}")
    return 0 if all(s.passes == len(s.outcomes) for s in summaries.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
