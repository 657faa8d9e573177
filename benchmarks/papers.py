"""The papers' published figures beside ours, simulated at the papers' scale.

    python benchmarks/papers.py [--check] [--device A100-80GB] [--efficiency 0.5]

Prints one row per figure (pipelab/bench/papers.py builds them): the paper, the figure, the
published value, ours (simulated with `pl.Costs.from_shape` at the paper's model, p, m, tensor
size and vocabulary, or the paper's closed form on our byte and FLOP model), their ratio, the
tolerance and a status; below the table, for each row outside its tolerance, what our model
leaves out. `--check` exits 1 if a row misses without an explanation, or if an explanation is
stale (its row is back within tolerance). Runs in a few seconds.
"""
from __future__ import annotations

import argparse
import sys
import time

from pipelab.bench import papers
from pipelab.sim.device import NAMED, Device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 on a row outside its tolerance without an explanation")
    ap.add_argument("--device", default="A100-80GB", choices=sorted(NAMED),
                    help="the device for the zero-bubble, vocabulary and DualPipe rows")
    ap.add_argument("--efficiency", type=float, default=None,
                    help="share of the device's peak its matmuls reach (default: the device's)")
    args = ap.parse_args(argv)
    device = Device.named(args.device)
    if args.efficiency is not None:
        device = device.with_efficiency(args.efficiency)
    t0 = time.perf_counter()
    rows = papers.papers_table(device)
    print(papers.format_table(rows))
    failed = papers.check(rows)
    print(f"\n{len(rows)} rows, {sum(r.status == 'ok' for r in rows)} within tolerance, "
          f"{sum(r.status == 'gap' for r in rows)} outside and explained, {len(failed)} failing "
          f"({time.perf_counter() - t0:.1f} s; {device.name} at efficiency {device.efficiency:g})")
    for r in failed:
        print(f"FAIL {r.figure}: {'explanation is stale' if r.gap else 'outside tolerance, unexplained'}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
