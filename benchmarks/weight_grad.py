"""Is the split backward as cheap as the full one? I + W against B per stage, and the memory.

    python benchmarks/weight_grad.py [--d-model 256] [--rows 8] [--seq-len 64] [--repeats 41]

Each stage of a uniform split of the toy GPT runs, in one process on one thread, what the
pipeline handlers run: F (forward, with the loss on the last stage), then either B (the full
backward) or I (input gradients; every Linear leaves its weight GEMMs in a WeightGradStore)
followed by W (those GEMMs). Times are per-action thread CPU time (`time.thread_time()`, steady
on a loaded machine), medians over `--repeats` repetitions with B and I/W interleaved. `B nn`
is the full backward of the same stage built with torch's own nn.Linear, to show that our
Linear did not make B (or F, `F nn`) slower. `faults` are the minor page faults of one I (B
has none): I keeps x and dy alive where B would reuse their memory at once, so glibc hands out
fresh pages, and the zeroing of those pages is CPU time of I. `--keep-heap` tells glibc to keep
freed memory (mallopt: no trimming, no mmap), as a caching allocator would, which separates
that allocator cost from the arithmetic. Bytes are the live activations the meter counts after F, after I
(the graph freed; what W still needs held by the store) and after W (nothing).

Target: (I + W) / B within 10% of 1 on every stage at a compute-bound size.
"""
from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import time

import torch
from torch import nn

import pipelab as pl
from pipelab.runtime.heap import keep_freed_memory
from pipelab.runtime.meter import ActivationMeter
from pipelab.model.weight_grad import Linear, WeightGradStore


def stock_copy(module: nn.Module) -> nn.Module:
    """The same stage with torch's nn.Linear in place of ours (same weights)."""
    clone = copy.deepcopy(module)
    for m in clone.modules():
        if isinstance(m, Linear):
            m.__class__ = nn.Linear
    return clone


class StageBench:
    """One stage, its input and output gradient, and the four actions as the handlers do them."""

    def __init__(self, cfg, bounds, s, inp, targets, grad):
        self.module = pl.build_layers(cfg, *bounds[s])
        self.stock = stock_copy(self.module)
        self.first, self.last = s == 0, s == len(bounds) - 1
        self.inp, self.targets, self.grad = inp, targets, grad
        self.meter = ActivationMeter(self.module.parameters())
        self.store = WeightGradStore(self.meter)

    def forward(self, module):
        inp = self.inp if self.first else self.inp.clone().requires_grad_()
        with self.meter.saving():
            out = module(inp)
            if self.last:
                out = pl.loss_fn(out, self.targets)
        return inp, out

    def step(self, clock=time.thread_time) -> dict:
        """F B, F I W and F B (nn.Linear); returns CPU seconds per action, faults and bytes."""
        t = {}
        c0 = clock()
        _inp, out = self.forward(self.module)
        t["F"] = clock() - c0
        c0 = clock()
        torch.autograd.backward(out, self.grad)
        t["B"] = clock() - c0
        del out, _inp
        _inp, out = self.forward(self.module)
        after_f = self.meter.live
        faults = _minor_faults()
        c0 = clock()
        with self.store.deferring(0, 0):
            torch.autograd.backward(out, self.grad)
        t["I"] = clock() - c0
        faults = _minor_faults() - faults
        del out, _inp
        after_i = self.meter.live
        c0 = clock()
        self.store.flush(0, 0)
        t["W"] = clock() - c0
        after_w = self.meter.live
        self.store = WeightGradStore(self.meter)       # a fresh step: the key may run again
        c0 = clock()
        _inp, out = self.forward(self.stock)
        t["F nn"] = clock() - c0
        c0 = clock()
        torch.autograd.backward(out, self.grad)
        t["B nn"] = clock() - c0
        del out, _inp
        self.module.zero_grad(set_to_none=True)
        self.stock.zero_grad(set_to_none=True)
        return {**t, "faults": faults, "after F": after_f, "after I": after_i, "after W": after_w}


def _minor_faults() -> int:
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_minflt


def measure(cfg, stages: int, rows: int, repeats: int, warmup: int = 3) -> list[dict]:
    bounds = pl.partition(cfg, stages).bounds
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=gen)
    benches, x = [], tokens
    for s in range(stages):                     # real stage inputs: the stages before, run
        module = pl.build_layers(cfg, *bounds[s])
        with torch.no_grad():
            out = module(x)
        grad = None if s == stages - 1 else torch.randn(out.shape, generator=gen) * 1e-3
        benches.append(StageBench(cfg, bounds, s, x, targets, grad))
        x = out
    samples = [[] for _ in benches]
    for k in range(warmup + repeats):
        for s, bench in enumerate(benches):
            row = bench.step()
            if k >= warmup:
                samples[s].append(row)
    table = []
    for s, rows_ in enumerate(samples):
        med = {key: statistics.median(r[key] for r in rows_) for key in rows_[0]}
        med["layers"] = pl.Partition(cfg, bounds, "uniform").layout.split("|")[s]
        med["I+W/B"] = (med["I"] + med["W"]) / med["B"]
        # the same ratio per repetition, to show its spread
        ratios = sorted((r["I"] + r["W"]) / r["B"] for r in rows_)
        med["ratio range"] = (ratios[len(ratios) // 10], ratios[-1 - len(ratios) // 10])
        table.append(med)
    return table


def print_table(cfg, rows: int, table: list[dict]) -> None:
    tokens = rows * cfg.seq_len
    print(f"d_model {cfg.d_model}, {cfg.n_layers} blocks, {rows} x {cfg.seq_len} = {tokens} "
          f"tokens per microbatch; thread CPU ms, medians")
    print(f"{'stage':>5} {'layers':>7} {'F':>6} {'F nn':>6} {'B':>6} {'B nn':>6} {'I':>6} "
          f"{'W':>6} {'(I+W)/B':>7} {'p10-p90':>9} {'F:I:W':>12} {'faults':>6} "
          f"{'bytes F':>9} {'bytes I':>9} {'I/F':>4} {'bytes W':>7}")
    for s, r in enumerate(table):
        ms = {k: r[k] * 1e3 for k in ("F", "F nn", "B", "B nn", "I", "W")}
        lo, hi = r["ratio range"]
        split = f"1:{r['I'] / r['F']:.2f}:{r['W'] / r['F']:.2f}"
        print(f"{s:>5} {r['layers']:>7} {ms['F']:6.2f} {ms['F nn']:6.2f} {ms['B']:6.2f} "
              f"{ms['B nn']:6.2f} {ms['I']:6.2f} {ms['W']:6.2f} {r['I+W/B']:7.3f} "
              f"{lo:4.2f}-{hi:<4.2f} {split:>12} {r['faults']:6.0f} {r['after F']:9d} "
              f"{r['after I']:9d} {r['after I'] / r['after F']:4.2f} {r['after W']:7d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--keep-heap", action="store_true",
                        help="rerun with glibc keeping freed memory (no page-fault cost)")
    args = parser.parse_args()
    if args.keep_heap:
        keep_freed_memory()       # what the pipeline workers do (pipelab/runtime/heap.py)
    torch.set_num_threads(1)                    # as a pipeline worker runs
    cfg = pl.ModelConfig(n_layers=args.n_layers, d_model=args.d_model, n_heads=args.heads,
                         seq_len=args.seq_len)
    table = measure(cfg, args.stages, args.rows, args.repeats)
    heap = "glibc keeps freed memory" if args.keep_heap else "default glibc"
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {heap}")
    print_table(cfg, args.rows, table)


if __name__ == "__main__":
    main()
