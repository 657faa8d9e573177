"""How fast is the schedule language on a big pipeline? 1F1B, 64 ranks × 1024 microbatches.

Prints the median of several repeats for each phase; the target is the three together under
0.5 s of CPU time on one core (CPU time: wall-clock on the shared 2-core machines measures the
neighbours too). `simulate` needs the execution order that `validate` computes; the
schedule caches it while unchanged, so the simulate phase measures the simulation alone.
"""
import argparse
import gc
import statistics
import time

import pipelab as pl
from pipelab.schedules import validate


def timed(fn, repeats):
    """Median wall and CPU seconds; CPU time is what the work needs when cores are shared."""
    wall, cpu = [], []
    for _ in range(repeats):
        gc.collect()    # start each repeat clean, so no repeat pays for the previous one's garbage
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedule", default="1f1b", choices=sorted(pl.SCHEDULES))
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    generator = pl.SCHEDULES[args.schedule]

    gen = timed(lambda: generator(ranks=args.ranks, microbatches=args.microbatches), args.repeats)
    sched = gen[2]
    val = timed(lambda: validate(sched), args.repeats)     # uncached, unlike sched.validate()
    sim = timed(lambda: pl.simulate(sched, pl.Costs()), args.repeats)
    tl = sim[2]
    print(f"{args.schedule}: {args.ranks} ranks x {args.microbatches} microbatches = {len(sched)} actions")
    print(f"{'phase':<10} {'wall s':>8} {'cpu s':>8} {'target s':>9}  ok")
    for phase, (wall, cpu, _) in (("generate", gen), ("validate", val), ("simulate", sim)):
        print(f"{phase:<10} {wall:8.3f} {cpu:8.3f} {'':>9}")
    wall, cpu = (sum(phase[i] for phase in (gen, val, sim)) for i in (0, 1))
    print(f"{'together':<10} {wall:8.3f} {cpu:8.3f} {0.5:9.1f}  {'yes' if cpu < 0.5 else 'NO'}")
    print("(simulate reuses the validated execution order that the schedule caches while unchanged)")
    print(f"makespan {tl.makespan:g} (formula {3 * (args.microbatches + args.ranks - 1)}), "
          f"bubble fraction {tl.bubble_fraction():.4f}")


if __name__ == "__main__":
    main()
