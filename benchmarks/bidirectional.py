"""Bubble, activation memory and weight memory of the bidirectional schedules against 1F1B and
the zero-bubble ones: simulated (unit costs, the same model) and measured (live runs).

    python benchmarks/bidirectional.py [--ranks 4] [--microbatches 8] [--d-model 128] [--quick]

Per schedule, simulated at F = I = W = 1 per rank's worth of layers: the bubble (idle share of
the makespan), the worst rank's idle time, the peak activations of the busiest rank (units of a
rank's worth of layers) and the weights per rank (× a rank's share of the model). Measured, one
live run each on `--ranks` processes (the toy GPT with 2·ranks layers, so every schedule gets
at least one layer per stage): the bubble of the replayed step (per-action CPU times, what
dedicated cores would show) and of the wall-clock step, the peak live activation bytes of the
busiest rank, the weight bytes of the busiest rank, and the max relative gradient error against
the unsplit model. Wall-clock figures need a quiet machine: the load average is printed.
"""
from __future__ import annotations

import argparse
import os

import pipelab as pl
from pipelab import bidirectional as bidir

UNIT = pl.Costs(F=1.0, I=1.0, W=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="2 ranks, 4 microbatches, d_model 64")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.microbatches, args.d_model = 2, 4, 64
    p, m = args.ranks, args.microbatches
    table = {r["name"]: r for r in bidir.memory_table(p, m, UNIT)}
    cfg = pl.ModelConfig(n_layers=2 * p - 2, d_model=args.d_model, n_heads=4, seq_len=16)
    load_before = os.getloadavg()
    measured = {}
    with pl.LocalCluster(p) as cluster:
        for name in bidir.NAMES:
            if table[name].get("error"):
                continue
            sched = pl.schedule(name, ranks=p, microbatches=m)
            cluster.run(sched, model=cfg, check=False, progress=False)      # warm-up
            measured[name] = cluster.run(sched, model=cfg, progress=False)
    load_after = os.getloadavg()
    print(f"p={p}, m={m}; simulated at F=I=W=1 per rank's worth of layers; measured: toy GPT "
          f"d_model {cfg.d_model}, {cfg.total_layers} layers, one run each after a warm-up")
    head = (f"{'schedule':<12}{'sim bubble':>11}{'idle':>7}{'act peak':>9}{'weights':>8}"
            f"{'| replay':>10}{'wall':>8}{'act KiB':>9}{'weight KiB':>11}{'grad err':>10}")
    print(head)
    print("-" * len(head))
    for name in bidir.NAMES:
        row = table[name]
        if row.get("error"):
            print(f"{name:<12} refused: {row['error'][:70]}")
            continue
        sim = bidir.worst_idle(pl.compare.simulate_named(name, p, m, UNIT))
        res = measured[name]
        act = max(res.timeline.peak_activations().values()) / 1024
        weights = max(res.rank_parameter_bytes.values()) / 1024
        print(f"{name:<12}{row['bubble']:>11.1%}{sim:>7.3g}{row['peak']:>9.3g}{row['weights']:>7.3g}×"
              f"{res.replay.bubble_fraction():>10.1%}{res.timeline.bubble_fraction():>8.1%}"
              f"{act:>9.0f}{weights:>11.0f}{res.max_grad_error:>10.1e}")
    print(f"load average (1, 5, 15 min): {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f} before, {load_after[0]:.1f} {load_after[1]:.1f} "
          f"{load_after[2]:.1f} after")


if __name__ == "__main__":
    main()
