"""How fast is the schedule language on a big pipeline? 1F1B, 64 ranks × 1024 microbatches.

Prints, for each phase (generate, validate, simulate), the best CPU time of several repeats
and the median wall-clock time beside the load average. The target (issue 27) is the three
together in at most 0.25 s of CPU on one core: CPU time, because wall-clock on the shared
2-core machines measures the neighbours too, and the best repeat, because a busy machine only
ever adds to it. `simulate` needs the execution order that `validate` computes; the schedule
caches it while unchanged, so the simulate phase measures the simulation alone.
"""
import argparse
import gc
import statistics
import time

import pipelab as pl
from pipelab.schedules import validate
from pipelab.support import noise

TARGET_CPU_S = 0.25


def timed(fn, repeats):
    """(best CPU seconds, median wall seconds, a result) over `repeats` runs. The previous
    run's result is freed before the next starts, outside the clocks."""
    wall, cpu, out = [], [], None
    for _ in range(repeats):
        out = None
        gc.collect()    # start each repeat clean, so no repeat pays for the previous one's garbage
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(cpu), statistics.median(wall), out


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
    print(f"{args.schedule}: {args.ranks} ranks x {args.microbatches} microbatches = "
          f"{len(sched)} actions; best CPU of {args.repeats} repeats, median wall-clock")
    print(f"{'phase':<10} {'cpu s':>8} {'wall s':>8}")
    for phase, (cpu, wall, _) in (("generate", gen), ("validate", val), ("simulate", sim)):
        print(f"{phase:<10} {cpu:8.3f} {wall:8.3f}")
    cpu, wall = (sum(phase[i] for phase in (gen, val, sim)) for i in (0, 1))
    print(f"{'together':<10} {cpu:8.3f} {wall:8.3f}   ({noise.load_line()})")
    print(f"target: together <= {TARGET_CPU_S} s of CPU: "
          f"{'met' if cpu <= TARGET_CPU_S else 'not met'} ({cpu:.3f} s)")
    print("(simulate reuses the validated execution order that the schedule caches while unchanged)")
    print(f"makespan {tl.makespan:g} (1F1B's closed form 3(m+p-1) = "
          f"{3 * (args.microbatches + args.ranks - 1)}), bubble fraction {tl.bubble_fraction():.4f}")


if __name__ == "__main__":
    main()
