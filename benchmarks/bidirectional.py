"""Bubble, activation memory and weight memory of the bidirectional schedules against 1F1B and
the zero-bubble ones: simulated (unit costs, the same model) and measured (live runs).

    python benchmarks/bidirectional.py [--ranks 4] [--microbatches 8] [--d-model 128] [--quick]

Per schedule, simulated at F = I = W = 1 per rank's worth of layers: the bubble (idle share of
the makespan), the worst rank's idle time, the peak activations of the busiest rank (units of a
rank's worth of layers) and the weights per rank (× a rank's share of the model). Measured, one
live run each on `--ranks` processes, `--repeats` times (medians): the bubble of the step simulated
from the run's fitted costs (one median cost per stage and kind: the dedicated-core picture, robust
to a stray slow action), of the replayed step (every action's own CPU time) and of the wall-clock
step, the peak live activation bytes of the
busiest rank, the weight bytes of the busiest rank, and the max relative gradient error against
the unsplit model. Wall-clock figures need a quiet machine: the load average is printed.

A fair comparison needs stages of equal work, or the replayed bubble measures the partition,
not the schedule: the toy GPT gets 4·ranks blocks (4 per stage for the one-stage-per-rank
schedules, 2 per chunk for the V ones) and every run uses partition="cost", which places the
embedding and the head where they least unbalance the stages. The `stage max/mean` column is
the run's own partition: its busiest stage's FLOPs over the mean (1.00 is perfectly even). The
`G share` column is the longest replica sum (`G`, the gradient all-reduce between the two copies
of a part, at the end of the step) over the fitted step: the simulated columns charge it nothing,
so where it is large the measured bubble of Chimera and DualPipe is the replica sum's price.

Then Chimera's scaling to m > p (its §3.5): forward doubling (the default) against direct
concatenation, 1F1B and DualPipe at p = 4, m = 8, 16, 32, with a backward twice a forward
(B = I + W = 2F, a real model's proportion) and equal to it (the paper's slots): simulated
makespan, bubble, the worst rank's idle time and the busiest rank's peak activations. And one
live run of each scaling on `--ranks` processes with m = 4·ranks (two doubled units): its
gradient error against the unsplit model, the bubble of the step simulated from its fitted
costs, and its measured activation peak.
"""
from __future__ import annotations

import argparse
import statistics

import pipelab as pl
from pipelab.chapters import bidirectional as bidir
from pipelab.bench.load import load_average

UNIT = pl.Costs(F=1.0, I=1.0, W=1.0)


def replica_sum_share(res) -> float:
    """The longest replica sum `G` of the run's fitted step, as a share of that step."""
    tl = res.simulated
    sums = [e.end - e.start for r in range(tl.ranks) for e in tl.events_of(r)
            if e.action.kind == "G"]
    return max(sums, default=0.0) / tl.makespan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per schedule")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 4 microbatches, d_model 64")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.microbatches, args.d_model = 2, 4, 64
    p, m = args.ranks, args.microbatches
    table = {r["name"]: r for r in bidir.memory_table(p, m, UNIT)}
    # 4p blocks: whole blocks for p stages and for a V's 2p, balanced by "cost" (docstring).
    cfg = pl.ModelConfig(n_layers=4 * p, d_model=args.d_model, n_heads=4, seq_len=16)
    load_before = load_average(1)
    measured = {}
    with pl.LocalCluster(p) as cluster:
        for name in bidir.NAMES:
            if table[name].get("error"):
                continue
            sched = pl.schedule(name, ranks=p, microbatches=m)
            cluster.run(sched, model=cfg, partition="cost", check=False, progress=False)  # warm-up
            measured[name] = [cluster.run(sched, model=cfg, partition="cost", check=k == 0,
                                          progress=False) for k in range(args.repeats)]
        scaling_live = {scaling: cluster.run(pl.schedule("chimera", ranks=p, microbatches=4 * p,
                                                         scaling=scaling),
                                             model=cfg, partition="cost", progress=False)
                        for scaling in ("doubling", "concat")}
    load_after = load_average(1)
    print(f"p={p}, m={m}; simulated at F=I=W=1 per rank's worth of layers; measured: toy GPT "
          f"d_model {cfg.d_model}, {cfg.total_layers} layers, partition='cost', median of "
          f"{args.repeats} runs each after a warm-up")
    head = (f"{'schedule':<12}{'sim bubble':>11}{'idle':>7}{'act peak':>9}{'weights':>8}"
            f"{'| stage max/mean':>17}{'fitted':>8}{'G share':>8}{'replay':>8}{'wall':>8}"
            f"{'act KiB':>9}{'weight KiB':>11}"
            f"{'grad err':>10}")
    print(head)
    print("-" * len(head))
    for name in bidir.NAMES:
        row = table[name]
        if row.get("error"):
            print(f"{name:<12} refused: {row['error'][:70]}")
            continue
        sim = bidir.worst_idle(pl.compare.simulate_named(name, p, m, UNIT))
        runs = measured[name]
        res = runs[0]                           # the one checked against the unsplit model

        def median(bubble) -> float:
            return statistics.median(bubble(r) for r in runs)
        act = max(res.timeline.peak_activations().values()) / 1024
        weights = max(res.rank_parameter_bytes.values()) / 1024
        parts = sorted(set(res.spec.bounds))                  # a replicated part counted once
        flops = pl.Partition(cfg, parts, "run").loads("flops")
        balance = max(flops) / (sum(flops) / len(flops))
        print(f"{name:<12}{row['bubble']:>11.1%}{sim:>7.3g}{row['peak']:>9.3g}{row['weights']:>7.3g}×"
              f"{balance:>17.2f}{median(lambda r: r.simulated.bubble_fraction()):>8.1%}"
              f"{median(replica_sum_share):>8.1%}"
              f"{median(lambda r: r.replay.bubble_fraction()):>8.1%}"
              f"{median(lambda r: r.timeline.bubble_fraction()):>8.1%}"
              f"{act:>9.0f}{weights:>11.0f}{res.max_grad_error:>10.1e}")
    print()
    print("Chimera's scaling (§3.5), simulated at p=4, F=1 per rank's worth of layers, "
          "I = W = B/2:")
    print(bidir.format_scaling_table(bidir.chimera_scaling_table(4, (8, 16, 32), (2.0, 1.0))))
    print(f"live, p={p}, m={4 * p} (two doubled units), partition='cost':")
    for scaling, res in scaling_live.items():
        act = max(res.timeline.peak_activations().values()) / 1024
        print(f"  chimera ({scaling:<8}) grad err {res.max_grad_error:.1e}   fitted bubble "
              f"{res.simulated.bubble_fraction():.1%}   replayed {res.replay.bubble_fraction():.1%}"
              f"   act peak {act:.0f} KiB")
    print(f"load average (1, 5, 15 min): {load_before} before, {load_after} after")


if __name__ == "__main__":
    main()
