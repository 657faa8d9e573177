"""Vocabulary parallelism at a large vocabulary: baseline, layer redistribution, vocab-1, vocab-2,
and v-half-vocab (the passes on V-Half).

Step time and per-rank peak memory (parameters + activations) on 2 ranks live (wall clock and
the replay from per-action CPU times, median over rounds, every run gradient-checked), then 4
and 8 ranks simulated from the measured layer profile, and the same at the paper's
head-to-stage ratio for the comparison with its +5%..+51%. Then the three vocabulary-parallel
schedules side by side: activation peaks per rank (microbatches of a rank's blocks) and bubble,
simulated at 2, 4 and 8 ranks, and the meter's peaks at 2 ranks live.

    python benchmarks/vocab.py            # V = 32768, d_model 64, 2 blocks per rank
    python benchmarks/vocab.py --quick    # V = 4096, one round
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import pipelab as pl
from pipelab.chapters import vocabulary_parallelism as vs

# The paper's 8-GPU artifact: h = 3072, seq 4096, V = 256k, 32 layers on 8 stages. Per token,
# the output layer is 2hV FLOPs, a layer 24h² + 4sh: the head is about 5.8 layers.
PAPER_HEAD_IN_LAYERS = 2 * 3072 * 256_000 / (24 * 3072**2 + 4 * 4096 * 3072)
PAPER_LAYERS_PER_STAGE = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--blocks-per-rank", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4, help="rows (of 32 tokens) per microbatch")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="V = 4096, one round")
    args = ap.parse_args()
    if args.quick:
        args.vocab, args.rounds = 4096, 1
    cfg = pl.ModelConfig(n_layers=2 * args.blocks_per_rank, d_model=args.d_model, n_heads=4,
                         seq_len=32, vocab_size=args.vocab, tokens="contexts")
    prof = vs.VocabProfile.measure(cfg, rows=args.rows)
    print(f"V={args.vocab}, d_model={args.d_model}, {args.rows}x32 tokens per microbatch: block "
          f"{prof.block * 1e3:.2f} ms, head {prof.head * 1e3:.2f} ms "
          f"({prof.head / prof.block:.1f} blocks), S+T {(prof.S + prof.T) * 1e3:.2f} ms "
          f"(forward + backward, CPU time)")

    with pl.LocalCluster(ranks=2) as cluster:
        vs.live_runs(cluster, prof, args.microbatches, args.blocks_per_rank,
                     methods=vs.ALL_METHODS)                                      # warm-up
        live = [vs.live_runs(cluster, prof, args.microbatches, args.blocks_per_rank,
                             methods=vs.ALL_METHODS) for _ in range(args.rounds)]
    rounds = [vs.measured_rows(runs, prof, args.blocks_per_rank) for runs in live]
    print(f"\n2 ranks live, {args.microbatches} microbatches, median of {args.rounds} round(s):")
    print(f"{'method':15}{'wall (ms)':>11}{'replay (ms)':>13}{'vs baseline':>13}"
          f"{'peak memory per rank (MiB)':>30}{'grad error':>12}")
    base = statistics.median(r[0]["step"] for r in rounds)
    for k, method in enumerate(vs.ALL_METHODS):
        runs = [r[k] for r in rounds]
        wall = statistics.median(r["measured"] for r in runs)
        step = statistics.median(r["step"] for r in runs)
        mem = " ".join(f"{m / 2**20:.1f}" for m in runs[-1]["memory"])
        print(f"{method:15}{wall * 1e3:11.2f}{step * 1e3:13.2f}{base / step:12.2f}x{mem:>30}"
              f"{max(r['error'] for r in runs):12.1e}")

    for p in (4, 8):
        print(f"\n{p} ranks, simulated from the measured profile ({2 * p} microbatches):")
        print(vs.format_rows(vs.method_table(prof, p, 2 * p, args.blocks_per_rank,
                                             methods=vs.ALL_METHODS)))

    # The three vocabulary-parallel schedules: how even is the transformer memory?
    vocab = ("vocab-1", "vocab-2", vs.VHALF)
    one = args.blocks_per_rank * prof.block_bytes / 2**20      # a microbatch of a rank's blocks
    print(f"\nActivation peaks per rank in microbatches of a rank's blocks (simulated from the "
          f"profile, 2p + 2 microbatches; bubble: the idle share of the step), and at p=2 the "
          f"meter's peaks of the last live round (MiB; one microbatch of a rank's blocks is "
          f"{one:.2f} MiB, each rank also holds its softmax shard and X copy):")
    print(f"{'method':15}{'p':>3}  {'simulated peaks':34}{'spread':>7}{'bubble':>8}"
          f"{'measured at p=2':>18}{'spread':>8}{'exact':>7}")
    for p in (2, 4, 8):
        for row in vs.method_table(prof, p, 2 * p + 2, args.blocks_per_rank, methods=vocab):
            sim = row["peaks"]
            peaks, bubble = " ".join(f"{x:g}" for x in sim), row["timeline"].bubble_fraction()
            line = f"{row['method']:15}{p:>3}  {peaks:34}{max(sim) - min(sim):7g}{bubble:8.1%}"
            if p == 2:
                got = [live[-1][row["method"]].peak_activations[r] / 2**20 for r in range(2)]
                exact = all(r[row["method"]].max_grad_error <= 1e-5 for r in live)
                shown = " ".join(f"{x:.2f}" for x in got)
                spread = (max(got) - min(got)) / one
                line += f"{shown:>18}{spread:7.2f}u{'yes' if exact else 'NO':>7}"
            print(line)

    paper_like = replace(prof, head=PAPER_HEAD_IN_LAYERS * prof.block,
                         S=prof.S * PAPER_HEAD_IN_LAYERS * prof.block / prof.head,
                         T=prof.T * PAPER_HEAD_IN_LAYERS * prof.block / prof.head)
    print(f"\nThe paper's ratio (head = {PAPER_HEAD_IN_LAYERS:.1f} layers, "
          f"{PAPER_LAYERS_PER_STAGE} layers per stage), 8 ranks, 16 microbatches, simulated:")
    print(vs.format_rows(vs.method_table(paper_like, 8, 16, PAPER_LAYERS_PER_STAGE)))


if __name__ == "__main__":
    main()
