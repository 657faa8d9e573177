"""What recomputation costs and saves: peak activation bytes and step time per policy.

    python benchmarks/recompute.py [--d-model 128] [--seq-len 128] [--rounds 5] [--quick]

Two pipeline ranks (LocalCluster), 1F1B and ZB-H1, the toy GPT split uniformly in two stages,
each policy (none, selective, full, every-k with k = √blocks per stage) run `--rounds` times in
rotating order after one warm-up run each. Per policy and rank: the measured peak of live
activation bytes (the meter's per-action peak) next to the byte model's (memory.py, replayed
along the measured timeline); the step time as replayed from measured per-action CPU time (what
two dedicated cores would show; the median over rounds), its overhead over `none`, and the
share of CPU time spent in `R`. Measured wall-clock makespans are printed too, but on a shared
machine they are noise: quote `uptime` beside them.

Reference points (Korthikanti et al., arXiv 2205.05198): selective recomputation saves most of
the activation memory for a few percent of compute; full recomputation costs about one extra
forward (a third more than F + B).
"""
from __future__ import annotations

import argparse
import os
import statistics

import pipelab as pl
from pipelab.model import memory

POLICIES = {"none": "none", "selective": "selective", "full": "full", "every-k": "every-k"}


def measure(cluster, schedule_name: str, cfg, microbatches: int, rows: int, rounds: int) -> list[dict]:
    runs: dict[str, list] = {name: [] for name in POLICIES}
    sched = pl.schedule(schedule_name, ranks=2, microbatches=microbatches)
    kw = dict(model=cfg, batch_size=rows * microbatches)
    for policy in POLICIES.values():          # warm-up, discarded
        cluster.run(sched, recompute=policy, check=False, **kw)
    names = list(POLICIES)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(cluster.run(sched, recompute=POLICIES[name], check=r == 0, **kw))
    base = statistics.median(res.replay.makespan for res in runs["none"])
    rows_out = []
    for name, results in runs.items():
        res = results[0]
        spec = res.spec
        model = memory.peak_bytes(res.timeline, cfg, spec.bounds, spec.rows_per_microbatch,
                                  spec.recompute or None)
        replay = statistics.median(x.replay.makespan for x in results)
        wall = statistics.median(x.timeline.makespan for x in results)
        r_share = statistics.median(
            sum(e.cpu for e in x.timeline.events if e.action.kind == "R")
            / sum(e.cpu for e in x.timeline.events) for x in results)
        rows_out.append(dict(schedule=schedule_name, policy=str(spec.recompute[0]) if spec.recompute
                             else "none", measured=res.peak_activations, model=model,
                             replay=replay, overhead=replay / base - 1, wall=wall,
                             r_share=r_share, error=res.max_grad_error))
    return rows_out


def table(rows: list[dict]) -> str:
    head = (f"{'schedule':9}{'policy':18}{'peak r0 MiB':>12}{'model r0':>10}{'peak r1 MiB':>12}"
            f"{'model r1':>10}{'saved r0':>9}{'step ms':>9}{'overhead':>9}{'R share':>8}"
            f"{'wall ms':>9}{'grad err':>10}")
    lines = [head, "-" * len(head)]
    none = {r["schedule"]: r for r in rows if r["policy"] == "none"}
    for r in rows:
        m, p = r["measured"], r["model"]
        saved = 1 - m[0] / none[r["schedule"]]["measured"][0]
        lines.append(f"{r['schedule']:9}{r['policy']:18}{m[0] / 2**20:12.3f}{p[0] / 2**20:10.3f}"
                     f"{m[1] / 2**20:12.3f}{p[1] / 2**20:10.3f}{saved:9.0%}"
                     f"{r['replay'] * 1e3:9.2f}{r['overhead']:9.1%}{r['r_share']:8.1%}"
                     f"{r['wall'] * 1e3:9.2f}{r['error']:10.1e}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rows", type=int, default=2, help="sequences per microbatch")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small model, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.d_model, args.seq_len, args.rounds = 4, 64, 64, 2
    cfg = pl.ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                         seq_len=args.seq_len, vocab_size=max(64, pl.VOCAB_SIZE))
    print(f"model: {args.layers} blocks, d_model {args.d_model}, {args.heads} heads, seq "
          f"{args.seq_len} (a·s/h = {args.heads * args.seq_len / args.d_model:g}); "
          f"{args.rows} sequences per microbatch, {args.microbatches} microbatches, 2 ranks; "
          f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    rows = []
    with pl.LocalCluster(ranks=2, timeout=120) as cluster:
        for name in ("1f1b", "zb-h1"):
            rows += measure(cluster, name, cfg, args.microbatches, args.rows, args.rounds)
    print(table(rows))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
