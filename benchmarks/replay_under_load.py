"""How far the measured step and its replay move when busy loops share the cores.

The same live 1F1B run (2 ranks, 3 steps) is repeated on a quiet machine and beside `--busy`
spinning processes (benchmarks/under_load.py's busy loops). Per condition it prints the median
and range of: the measured makespan (wall clock, last step), the replay from the last step's
CPU times (the replay before issue 20) and the replay from each action's smallest CPU time over
the steps (`RunResult.replay` now), and how much each moved from quiet to busy.

    python benchmarks/replay_under_load.py --rounds 5 --busy 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipelab as pl  # noqa: E402
from pipelab.support.noise import load_average  # noqa: E402
from under_load import busy_loops  # noqa: E402

CFG = pl.ModelConfig(n_layers=4, d_model=128, n_heads=4, seq_len=32)


def last_step_replay(res) -> float:
    """The replay's makespan from the last step's CPU time of each action alone."""
    cpu = {e.action: e.cpu for e in res.timelines[-1].events}
    return pl.simulate(res.schedule, pl.Costs(per_action=cpu, comm=res.comm_latency,
                                              unit="s")).makespan


def measure(cluster, sched, rounds: int, steps: int) -> dict[str, list[float]]:
    out = {"measured": [], "replay, last step": [], "replay, min over steps": [], "load": []}
    for _ in range(rounds):
        res = cluster.run(sched, model=CFG, batch_size=64, steps=steps, progress=False)
        out["measured"].append(res.timeline.makespan)
        out["replay, last step"].append(last_step_replay(res))
        out["replay, min over steps"].append(res.replay.makespan)
        out["load"].append(sum(res.load) / 2)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.busy < 1 or args.steps < 1:
        raise SystemExit("--rounds, --busy and --steps must be at least 1")
    sched = pl.schedule("1f1b", ranks=2, microbatches=8)
    results = {}
    with pl.LocalCluster(2, timeout=120) as cluster:
        cluster.run(sched, model=CFG, batch_size=64, progress=False)          # warm up
        for label, busy in (("quiet", 0), (f"{args.busy} busy", args.busy)):
            with busy_loops(busy):
                results[label] = measure(cluster, sched, args.rounds, args.steps)
    quiet, loaded = results.values()
    print(f"1F1B, 2 ranks, 8 microbatches, {args.steps} steps per run, {args.rounds} runs each; "
          f"makespans in ms, median (range); load averages {statistics.median(quiet['load']):.1f} "
          f"(quiet) and {statistics.median(loaded['load']):.1f} (busy); load now {load_average():.1f}")
    names = [k for k in quiet if k != "load"]
    print(f"{'':26}" + "".join(f"{label:>24}" for label in results) + f"{'busy / quiet':>14}")
    for name in names:
        cells = [f"{statistics.median(r[name]) * 1e3:.1f} ({min(r[name]) * 1e3:.1f}–"
                 f"{max(r[name]) * 1e3:.1f})" for r in results.values()]
        moved = statistics.median(loaded[name]) / statistics.median(quiet[name])
        print(f"{name:26}" + "".join(f"{c:>24}" for c in cells) + f"{moved:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
