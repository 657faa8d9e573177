"""How fast is the schedule language on a big pipeline? 1F1B, 64 ranks × 1024 microbatches.

Prints the median of several repeats for each phase; the target is under 0.5 s each on the
project's 2-core machines. `simulate` validates too (it needs the execution order), so its time
includes a validation.
"""
import argparse
import statistics
import time

import pipelab as pl


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedule", default="1f1b", choices=sorted(pl.SCHEDULES))
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    generator = pl.SCHEDULES[args.schedule]

    t_gen, sched = timed(lambda: generator(ranks=args.ranks, microbatches=args.microbatches), args.repeats)
    t_val, _ = timed(sched.validate, args.repeats)
    t_sim, tl = timed(lambda: pl.simulate(sched, pl.Costs()), args.repeats)
    print(f"{args.schedule}: {args.ranks} ranks x {args.microbatches} microbatches = {len(sched)} actions")
    print(f"{'phase':<10} {'median s':>9} {'target s':>9}  ok")
    for phase, seconds in (("generate", t_gen), ("validate", t_val), ("simulate", t_sim)):
        print(f"{phase:<10} {seconds:9.3f} {0.5:9.1f}  {'yes' if seconds < 0.5 else 'NO'}")
    print(f"makespan {tl.makespan:g} (formula {3 * (args.microbatches + args.ranks - 1)}), "
          f"bubble fraction {tl.bubble_fraction():.4f}")


if __name__ == "__main__":
    main()
