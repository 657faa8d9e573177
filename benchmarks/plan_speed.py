"""How fast is the planner? A 16-layer model on 16 devices: ~2,200 candidates (tensor and
vocabulary parallelism included); the target is < 10 s of CPU per 1,000 candidates.

Calibration (timing each layer once) is measured apart: a plan reuses one. The plan itself is
what a sweep repeats. CPU time is the judged figure (the 2-core machines are shared).
"""
import argparse
import time

import pipelab as pl
from pipelab.planner.plan import SCHEDULE_NAMES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=384)
    parser.add_argument("--budget-mib", type=float, default=32.0)
    parser.add_argument("--quick", action="store_true", help="8 devices, batch 64")
    args = parser.parse_args()
    if args.quick:
        args.devices, args.batch_size = 8, 64
    cfg = pl.ModelConfig(n_layers=args.layers)
    w0, c0 = time.perf_counter(), time.process_time()
    cal = pl.calibrate(cfg)
    cal_wall, cal_cpu = time.perf_counter() - w0, time.process_time() - c0
    w0, c0 = time.perf_counter(), time.process_time()
    plan = pl.plan(cfg, devices=args.devices, memory_per_device=int(args.budget_mib * 2**20),
                   batch_size=args.batch_size, calibration=cal,
                   schedules=(*SCHEDULE_NAMES, "looped-bfs"), chunks=(2, 4))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(f"{args.layers}-layer model, {args.devices} devices, batch {args.batch_size}, "
          f"budget {args.budget_mib:g} MiB per device")
    print(f"{'phase':<10} {'candidates':>10} {'wall s':>8} {'cpu s':>8} {'target s':>9}  ok")
    print(f"{'calibrate':<10} {'':>10} {cal_wall:8.2f} {cal_cpu:8.2f}")
    per_1000 = cpu / len(plan) * 1000              # the target is for a 1,000-candidate plan
    print(f"{'plan':<10} {len(plan):>10} {wall:8.2f} {cpu:8.2f}")
    print(f"{'per 1,000':<10} {1000:>10} {'':>8} {per_1000:8.2f} {10.0:9.1f}  "
          f"{'yes' if per_1000 < 10 else 'NO'}")
    print(f"{cpu / len(plan) * 1e3:.2f} ms of CPU per candidate; {len(plan.fitting)} fit; "
          f"tensor degrees {sorted({c.tensor for c in plan})}, "
          f"{sum(c.vocab for c in plan)} vocabulary-parallel")
    print(plan.explain())


if __name__ == "__main__":
    main()
