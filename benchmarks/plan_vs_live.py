"""The planner against reality: predicted vs measured step time and peak memory, run live.

Calibrates the model (per-layer costs, then message latency and per-action overhead from one
live run), plans for the devices this machine can run (2 processes by default), and runs the
best fitting candidate of each schedule and pipeline degree, and of each recomputation policy. Step time is compared with the
measured wall-clock step (median of the steps after the first) and with the replay (the
measured CPU time of each action, placed by the simulator: what dedicated cores would show).
Peak memory: the activation meter's peak plus parameters, gradients and AdamW state.
Target: within 20%. Quote `uptime` with the figures: the 2 cores are shared.
"""
import argparse
import os

import pipelab as pl
from pipelab.planner import check as plan_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--budget-mib", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="one candidate per schedule family and tensor degree (and per "
                             "recomputation policy)")
    args = parser.parse_args()
    cfg = pl.ModelConfig(n_layers=args.layers, d_model=args.d_model)
    with pl.LocalCluster(ranks=args.devices) as cluster:
        cal = pl.calibrate(cfg, cluster=cluster)
        plan = pl.plan(cfg, devices=args.devices, memory_per_device=int(args.budget_mib * 2**20),
                       batch_size=args.batch_size, calibration=cal)
        print(f"{len(plan)} candidates, {len(plan.fitting)} fit in {args.budget_mib:g} MiB; "
              f"latency {cal.latency * 1e6:.0f} us, overhead {cal.overhead * 1e6:.0f} us/action")
        print(plan.explain())
        chosen, seen = [], set()
        for c in plan.fitting:            # the best of each family, and of each policy
            keys = {(c.schedule, c.tensor) if args.quick else (c.schedule, c.pipeline, c.tensor),
                    c.recompute}
            if keys - seen and plan_check.can_run(c, cluster):
                seen |= keys
                chosen.append(c)
        rows = [plan_check.measure(c, plan, cluster, steps=args.steps) for c in chosen]
    print(plan_check.table(rows))
    for what, against in (("time", "measured"), ("time", "replayed"), ("peak", "measured")):
        errs = [abs(plan_check.error(r, what, against)) for r in rows]
        print(f"{what} vs {against}: {sum(e <= 0.2 for e in errs)}/{len(errs)} within 20%, "
              f"worst {max(errs):.0%}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
