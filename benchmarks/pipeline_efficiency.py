"""How close do real 2-rank pipelines come to the ideal speed-up? Prints a table.

    python benchmarks/pipeline_efficiency.py [--microbatches 8] [--rows 8] [--repeats 7]

Two pinned ranks run every 2-rank schedule (GPipe, 1F1B, interleaved and looped-BFS with two
chunks per rank, ZB-H1, ZB-H2, ZB-V) on compute-bound microbatches (rows × seq_len tokens of
width d_model: tens of milliseconds per stage and microbatch), stages split by FLOPs ("cost");
the single-process baseline is
the same executor on one rank running the same microbatches one after another (gradient
accumulation), so both sides pay the same per-action overheads. Step time is the measured
makespan of the actions (no optimizer). Medians over `--repeats` runs after a warm-up run,
the baseline and the schedules interleaved so they share whatever else loads the machine.

Targets: efficiency = speed-up / ideal ≥ 0.9 for the flushing schedules, with 1F1B's ideal
m·p/(m+p−1); the best zero-bubble row above that ideal (a speed-up no flushing 1F1B can reach);
every row's measured step within 15% of its replay (the simulator fed each action's measured
CPU time); a warm re-run of a small pipeline in under a second.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import pipelab as pl


def measure(clusters: dict, scheds: dict, cfg, batch_size: int, repeats: int) -> dict:
    """Median makespans per schedule. Runs are interleaved (single, gpipe, 1f1b, single, ...)
    so that every schedule sees the same background load on a shared machine."""
    first = {name: clusters[name].run(s, model=cfg, batch_size=batch_size,      # warm-up
                                      partition="cost")
             for name, s in scheds.items()}
    runs: dict[str, list[pl.RunResult]] = {name: [] for name in scheds}
    for _ in range(repeats):
        for name, s in scheds.items():
            runs[name].append(clusters[name].run(s, model=cfg, batch_size=batch_size,
                                                 partition="cost", check=False))
    return {name: {"measured": statistics.median(r.timeline.makespan for r in rs),
                   "replayed": statistics.median(r.replay.makespan for r in rs),
                   "grad_error": first[name].max_grad_error,
                   "stage_ms": _stage_ms(rs[-1])}
            for name, rs in runs.items()}


def _stage_ms(res: pl.RunResult) -> list[float]:
    """Mean CPU milliseconds of one microbatch's work (all kinds) on each stage."""
    per_stage: dict[int, float] = {}
    for e in res.timeline.events:
        per_stage[e.action.stage] = per_stage.get(e.action.stage, 0.0) + e.cpu
    m = res.schedule.microbatches
    return [per_stage[s] / m * 1e3 for s in sorted(per_stage)]


ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-v")
SCHEDULES = {"gpipe": {}, "1f1b": {}, "interleaved-1f1b": {"chunks": 2},
             "looped-bfs": {"chunks": 2}, "zb-h1": {}, "zb-h2": {}, "zb-v": {}}


def warm_rerun(repeats: int = 10) -> tuple[float, float]:
    """Cold start of a 2-rank cluster, and the median caller-side time of a warm small run."""
    began = time.perf_counter()
    with pl.LocalCluster(2) as cluster:
        cold = time.perf_counter() - began
        sched = pl.schedule("1f1b", ranks=2, microbatches=4)
        cluster.run(sched)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            cluster.run(sched)
            times.append(time.perf_counter() - t)
    return cold, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8, help="sequences per microbatch")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help="comma-separated names (default: every 2-rank schedule)")
    args = parser.parse_args()
    names = [n for n in args.schedules.split(",") if n]
    missing = [n for n in names if n not in pl.SCHEDULES or n not in SCHEDULES]
    if missing:
        parser.error(f"unknown schedule(s) {missing}; choose from {', '.join(SCHEDULES)}")

    load_before = os.getloadavg()[0]
    p, m = 2, args.microbatches
    cfg = pl.ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=4,
                         seq_len=args.seq_len)
    batch = m * args.rows
    ideal = m * p / (m + p - 1)
    scheds = {"single": pl.schedule("gpipe", ranks=1, microbatches=m)}
    scheds.update({name: pl.schedule(name, ranks=p, microbatches=m, **SCHEDULES[name])
                   for name in names})
    with pl.LocalCluster(1) as one, pl.LocalCluster(p) as two:
        cores = two.cores
        medians = measure({name: one if name == "single" else two for name in scheds},
                          scheds, cfg, batch, args.repeats)
    single = medians.pop("single")
    rows = []
    for name, piped in medians.items():
        speedup = single["measured"] / piped["measured"]
        gap = piped["measured"] / piped["replayed"] - 1
        rows.append((name, piped, speedup, speedup / ideal, gap))
    cold, warm = warm_rerun()
    load_after = os.getloadavg()[0]

    print(f"pipeline efficiency: {p} ranks pinned to cores {cores}, {m} microbatches of "
          f"{args.rows}x{args.seq_len} tokens, d_model {args.d_model}, {args.layers} blocks; "
          f"median of {args.repeats}; load average {load_before:.1f} before, "
          f"{load_after:.1f} after (wall-clock figures need a quiet machine)")
    print("per microbatch F+B CPU per stage (ms): "
          + ", ".join(f"{x:.1f}" for x in rows[-1][1]["stage_ms"])
          + f"; single process: {single['measured'] * 1e3:.1f} ms per step")
    head = (f"{'schedule':<17}{'single ms':>10}{'pipe ms':>9}{'replay ms':>10}{'speed-up':>9}"
            f"{'1F1B ideal':>11}{'effic.':>8}{'meas/replay':>12}{'grad err':>10}")
    print(head)
    print("-" * len(head))
    for name, piped, speedup, efficiency, gap in rows:
        print(f"{name:<17}{single['measured'] * 1e3:>10.1f}{piped['measured'] * 1e3:>9.1f}"
              f"{piped['replayed'] * 1e3:>10.1f}{speedup:>9.2f}{ideal:>11.2f}{efficiency:>8.2f}"
              f"{gap:>+12.1%}{piped['grad_error']:>10.1e}")
    print(f"warm re-run of a small pipeline (1f1b, 2 ranks, 4 microbatches): {warm * 1e3:.0f} ms "
          f"(target < 1000 ms); cold start of 2 workers: {cold:.1f} s")
    flushing = [r for r in rows if r[0] not in ZERO_BUBBLE]
    zero_bubble = [r for r in rows if r[0] in ZERO_BUBBLE]
    ok = all(eff >= 0.9 for _n, _p, _s, eff, _g in flushing) \
        and all(abs(gap) <= 0.15 for *_rest, gap in rows) and warm < 1 \
        and (not zero_bubble or max(speedup for _n, _p, speedup, _e, _g in zero_bubble) > ideal)
    print("targets (flushing efficiency >= 0.9, best zero-bubble speed-up > 1F1B's ideal, "
          "|measured/replay - 1| <= 15%, warm re-run < 1 s):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
