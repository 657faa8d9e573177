"""Synchronous against asynchronous pipelines on 2 ranks: throughput, loss after N samples,
weight memory per rank.

    python benchmarks/async.py [--batches 24] [--per 4] [--rows 8] [--d-model 64] [--lr 0.05]
                               [--rounds 3] [--quick]

Every schedule trains the toy GPT with plain SGD on the same stream of `batches × per`
microbatches of `rows` rows each (same samples, same order, same learning rate):

- `1f1b`: an update after each batch of `per` microbatches, behind a flush (the reference);
- `pipedream`: an update after every microbatch's backward, no flush (weight stashing);
- `pipedream-2bw`: an update per batch of `per`, no flush, applied one batch late;
- `1f1b, m=1`: PipeDream's synchronous twin (an update per microbatch, each behind a flush).

Throughput is samples/s: measured (wall clock of the run, median over `--rounds`), replayed
(each action at its measured CPU time, messages at the measured latency) and simulated (one
cost table fitted on every run's CPU times, no message cost: the schedule's own shape). The loss
is the mean loss of the last batch and the mean over the run (runs are deterministic, so the
rounds agree). Weight memory is the peak bytes of weight versions each rank held, counted by
the workers. Quote `uptime` beside the figures: wall-clock time on a shared machine is noisy.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import pipelab as pl
from pipelab.chapters import async_pipelines as asynchrony
from pipelab.bench.load import load_average


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--per", type=int, default=4, help="microbatches per update batch")
    parser.add_argument("--rows", type=int, default=8, help="rows per microbatch")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 batches, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.rounds = 8, 1
    cfg = pl.ModelConfig(n_layers=2, d_model=args.d_model, n_heads=4, seq_len=32)
    scheds = asynchrony.training_schedules(2, args.batches, args.per, twins=True)
    samples = args.rows * args.per * args.batches
    runs: dict[str, list] = {name: [] for name in scheds}
    with pl.LocalCluster(ranks=2) as cluster:
        for _ in range(args.rounds):
            for name, sched in scheds.items():     # one of each per round: noise hits all alike
                runs[name].append(cluster.run(sched, model=cfg, lr=args.lr, seed=1, check=False,
                                              batch_size=samples))
    costs = replace(pl.compare.fit_costs(*(r for rs in runs.values() for r in rs)), comm=0.0)
    print(f"2 ranks, {args.batches} batches × {args.per} microbatches × {args.rows} rows = "
          f"{samples} samples, d_model {args.d_model}, SGD lr {args.lr}, {args.rounds} round(s); "
          f"load average {load_average()}")
    print(f"{'schedule':14s}{'measured':>10s}{'replayed':>10s}{'simulated':>10s}  samples/s   "
          f"{'last loss':>9s}{'mean loss':>10s}   weight bytes rank 0 / rank 1")
    for name, rs in runs.items():
        measured = statistics.median(samples / r.timeline.makespan for r in rs)
        replayed = statistics.median(samples / r.replay.makespan for r in rs)
        simulated = samples / pl.simulate(scheds[name], costs).makespan
        curve = asynchrony.batch_losses(rs[0], args.per)
        weights = rs[0].versions.weight_bytes
        print(f"{name:14s}{measured:10.0f}{replayed:10.0f}{simulated:10.0f}             "
              f"{curve[-1]:9.3f}{sum(curve) / len(curve):10.3f}   {weights[0]:,} / {weights[1]:,}")


if __name__ == "__main__":
    main()
