"""Mixture of experts on processes: what the all-to-all costs, and EP × PP against dense PP.

    python benchmarks/moe.py [--quick] [--d-model 256] [--experts 4] [--top-k 2]

1. One MoE layer with its experts divided over 2 processes (expert parallelism): per forward,
   the dispatch and combine all-to-alls of the rows (the small split-size exchange before
   dispatch is not counted) against the expert compute; per backward, the two all-to-alls
   against the whole backward. Medians over `--repeats`, wall-clock seconds from the
   layer's own records.
2. A training step of the toy GPT on 4 processes: EP 2 × PP 2 (MoE blocks, top-k experts of
   width d_ff) against dense PP 2 × DP 2 whose MLP has the same *active* parameters per token
   (d_ff · k), on the same batch and 1F1B schedule. Medians over `--rounds` alternating runs of
   the measured and the replayed (per-action CPU time) makespans.

Wall-clock on a shared machine is noisy: the script prints the load average next to the table.
"""
from __future__ import annotations

import argparse
import os
import statistics

import pipelab as pl
from pipelab.bench.load import load_average
from pipelab.model.moe import moe_parameter_counts


def exchange_table(cluster, args) -> None:
    job = dict(d_model=args.d_model, d_ff=args.d_ff, n_experts=args.experts, top_k=args.top_k,
               capacity_factor=args.capacity, rows=args.rows, seq_len=args.seq_len,
               warmup=2, repeats=args.repeats)
    per_rank = cluster.call("pipelab.bench.moe_side:layer_times", job, timeout=300)
    tokens = args.rows * args.seq_len
    print(f"\n1. one MoE layer, expert parallelism over 2 processes: d_model {args.d_model}, "
          f"d_ff {args.d_ff}, E {args.experts}, top-{args.top_k}, c {args.capacity:g}, "
          f"{tokens} tokens per process (medians of {args.repeats}, ms)")
    keys = ["dispatch", "combine", "experts", "a2a backward", "backward"]
    print(f"{'process':>8}" + "".join(f"{k:>14}" for k in keys) + f"{'a2a / experts':>15}")
    for rank, times in enumerate(per_rank):
        ratio = (times["dispatch"] + times["combine"]) / times["experts"]
        print(f"{rank:>8}" + "".join(f"{times[k] * 1e3:14.3f}" for k in keys) + f"{ratio:15.2f}")


def step_table(args) -> None:
    base = dict(n_layers=args.layers, d_model=args.d_model, n_heads=4, seq_len=args.seq_len)
    moe_cfg = pl.ModelConfig(**base, d_ff=args.d_ff, n_experts=args.experts, top_k=args.top_k,
                             capacity_factor=args.capacity)
    dense_cfg = pl.ModelConfig(**base, d_ff=args.d_ff * args.top_k)
    sched = pl.schedule("1f1b", ranks=2, microbatches=args.microbatches)
    batch = args.rows * args.microbatches * 2
    runs = {"EP 2 x PP 2 (MoE)": dict(model=moe_cfg, expert_parallel=2),
            "DP 2 x PP 2 (dense)": dict(model=dense_cfg, data_parallel=2)}
    times: dict[str, dict[str, list[float]]] = {k: {"measured": [], "replayed": []} for k in runs}
    with pl.LocalCluster(ranks=4, timeout=120) as cluster:
        for name, kw in runs.items():                       # warm-up, discarded
            cluster.run(sched, batch_size=batch, check=False, progress=False, **kw)
        for i in range(args.rounds):
            order = list(runs.items()) if i % 2 == 0 else list(runs.items())[::-1]
            for name, kw in order:
                res = cluster.run(sched, batch_size=batch, check=(i == 0), progress=False, **kw)
                if i == 0:
                    assert res.max_grad_error <= 1e-5, (name, res.max_grad_error)
                times[name]["measured"].append(res.timeline.makespan)
                times[name]["replayed"].append(res.replay.makespan)
    active = moe_parameter_counts(args.d_model, args.d_ff, args.experts, args.top_k)
    print(f"\n2. one training step, 1F1B, 2 pipeline ranks × 2, {args.microbatches} microbatches "
          f"of {args.rows} rows × {args.seq_len} tokens per replica; MoE MLP: {active[0]:,} "
          f"parameters held, {active[1]:,} active per token; dense MLP d_ff {args.d_ff * args.top_k}: "
          f"{2 * args.d_model * args.d_ff * args.top_k + args.d_ff * args.top_k + args.d_model:,} "
          f"(medians of {args.rounds} rounds, ms; both exact against the unsplit model)")
    print(f"{'':24}{'measured':>12}{'replayed':>12}")
    for name, t in times.items():
        print(f"{name:24}{statistics.median(t['measured']) * 1e3:12.2f}"
              f"{statistics.median(t['replayed']) * 1e3:12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=512, help="width of one expert")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--capacity", type=float, default=1.25)
    parser.add_argument("--rows", type=int, default=8, help="rows per microbatch (per process)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.d_ff, args.rows, args.seq_len = 64, 128, 4, 32
        args.repeats, args.rounds = 7, 2
    print(f"load average {load_average()} on {os.cpu_count()} cores")
    with pl.LocalCluster(ranks=2, timeout=120) as cluster:
        exchange_table(cluster, args)
    step_table(args)
    print(f"\nload average {load_average()} after the run")


if __name__ == "__main__":
    main()
