"""pipelab's runtime side by side with torch.distributed.pipelining, on the same stages.

    python benchmarks/vs_torch.py [--steps 12] [--warmup 3] [--microbatches 8] [--ranks 2]
                                  [--sizes compute,overhead] [--schedules dualpipe-v,...]
                                  [--no-tables] [--profile] [--same-order-only]

For every schedule name in `pl.SCHEDULES` that has a torch peer (gpipe ↔ ScheduleGPipe, 1f1b ↔
Schedule1F1B, interleaved-1f1b ↔ ScheduleInterleaved1F1B, looped-bfs ↔ ScheduleLoopedBFS,
zb-v ↔ ScheduleZBVZeroBubble, zb-h1/zb-h2 ↔ ScheduleInterleavedZeroBubble where the stage
placement matches, dualpipe-v ↔ ScheduleDualPipeV: its overlapped pairs run one half after the
other on a CPU in both runtimes), both runtimes run the same model split the same way (each stage is
`pl.build_layers(cfg, start, stop)`, the same partition, batch and microbatches), alternately,
in the *same* worker processes: ours through `cluster.run`, torch's through
`cluster.call("pipelab.bench.torch_side:run_step", job)`. Ours runs with all its measuring on
(per-action clocks, activation meter, progress board).

Printed per schedule and size: each side's loss and max relative gradient error against the
unsplit `pl.ToyGPT(cfg)` on the same batch; each side's step time, the median over `--steps`
steps after `--warmup`, a step being defined identically on both sides: from the end of a
barrier to the last rank finishing the forward and backward of every microbatch (no optimizer);
and the ratio ours/torch; and the thread CPU time of the busiest rank over the same span
(ours measured by `pipelab.bench.ours_side`, the same executor with the same measuring), which a
loaded machine does not distort the way it distorts wall-clock time. The target, ours <= torch's
CPU per step on every row, is judged step by step (`pl.noise.verdict`, the extreme step on each
side dropped): met when ours is at most torch's in every counted step, NOT met when torch's is
smaller in every one, otherwise not resolvable at this load. Then the two schedule tables side
by side (torch's private `pipeline_order`, read without processes).

`--profile` adds where each side's CPU goes per action (thread CPU time, which a loaded machine
does not distort the way it distorts wall-clock time): total per action from unprofiled steps,
ours with its sampled activation meter (the default: one hooked forward per stage), with the
meter hooking every forward (`RunSpec.meter = "full"`) and without a meter, and a thread-time
cProfile folded into categories.

"Same order, two runtimes" (also alone with `--same-order-only`): every registered schedule
torch can express (`to_torch_csv` accepts it: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1,
zb-h2, zb-v, v-half, v-min, zb-auto, dualpipe-v) run by our runtime and by torch's
`_PipelineScheduleRuntime` from the exported file (`cluster.run(engine="torch")`), alternately in
the same worker processes: the same actions in the same order on both, so what differs is the
runtime. Each side's first step is checked against the unsplit model; step time (median) and the
busiest rank's thread CPU, both measured by the same call (`pipelab.bench.ours_side`) from the
end of the same barrier, with the ratio ours/torch judged step by step as above.

Wall-clock figures are only meaningful on a quiet machine: the load average is printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import statistics

import pipelab as pl
from pipelab.bench.torch_side import TORCH_PEERS, make_job, torch_table
from pipelab.runtime.result import reference_check

SIZES = {
    # name: (ModelConfig kwargs, rows per microbatch)
    "compute": (dict(n_layers=4, d_model=256, n_heads=4, seq_len=32), 8),
    "overhead": (dict(n_layers=4, d_model=64, n_heads=4, seq_len=16), 2),
}
TORCH_STEP = "pipelab.bench.torch_side:run_step"
OURS_STEP = "pipelab.bench.ours_side:run_step"


def our_schedule(name: str, ranks: int, microbatches: int, chunks: int) -> pl.Schedule:
    accepted = inspect.signature(pl.SCHEDULES[name]).parameters
    options = {"chunks": chunks} if "chunks" in accepted else {}
    return pl.schedule(name, ranks=ranks, microbatches=microbatches, **options)


def placement_style(sched: pl.Schedule) -> str | None:
    """torch's name for our placement ('loop' or 'v'), None when torch has no such placement."""
    if sched.placement == pl.loop_placement(sched.ranks, sched.chunks):
        return "loop"
    if sched.chunks == 2 and sched.placement == pl.v_placement(sched.ranks):
        return "v"
    return None


def pairs(ranks: int, microbatches: int, chunks: int,
          only: list[str] | None = None) -> list[tuple[str, pl.Schedule, str, str]]:
    """(name, our schedule, torch class, placement style) for every comparable schedule (or
    those named in `only`)."""
    out = []
    for name, (torch_class, style) in TORCH_PEERS.items():
        if only and name not in only:
            continue
        if name not in pl.SCHEDULES:
            print(f"note: {name} ({torch_class}) skipped: pipelab has no '{name}' schedule yet")
            continue
        try:
            sched = our_schedule(name, ranks, microbatches, chunks)
        except (ValueError, pl.ScheduleError) as err:
            print(f"note: {name} skipped: {err}")
            continue
        ours_style = placement_style(sched)
        if ours_style != style:
            print(f"note: {name} skipped: its placement {sched.placement} is not torch's "
                  f"{style} placement for {torch_class}")
            continue
        out.append((name, sched, torch_class, style))
    return out


def compare(cluster, name, sched, torch_class, style, cfg, batch, steps, warmup) -> dict:
    bounds = pl.partition(cfg, sched.stages).bounds
    job = make_job(torch_class, ranks=sched.ranks, microbatches=sched.microbatches, cfg=cfg,
                   bounds=bounds, batch_size=batch, chunks=sched.chunks, style=style)
    # First step of each: checked against the unsplit model on the same batch.
    first = cluster.run(sched, model=cfg, partition=bounds, batch_size=batch, progress=False)
    theirs = cluster.call(TORCH_STEP, {**job, "grads": True})
    grads = {k: g for rep in theirs for k, g in (rep["grads"] or {}).items()}
    ref_loss, torch_err, _ = reference_check(first.spec, grads)
    torch_losses = [x for rep in theirs for x in rep["losses"]]
    spec = dataclasses.replace(first.spec, check=False)
    ours_ms, torch_ms = [], []
    ours_cpu, torch_cpu = [], []                 # per step: thread CPU seconds of each rank
    for k in range(warmup + steps):              # alternate: all see the same background load
        res = cluster.run(sched, model=cfg, partition=bounds, batch_size=batch, check=False,
                          progress=False)
        reps = cluster.call(TORCH_STEP, job)
        mine = cluster.call(OURS_STEP, spec)     # the same executor, CPU time recorded
        if k >= warmup:
            # Timeline times count from the earliest rank's start of step (just after the
            # barrier), so the latest end is the step time.
            ours_ms.append(max(e.end for e in res.timeline.events) * 1e3)
            torch_ms.append((max(r["end"] for r in reps) - min(r["begin"] for r in reps)) * 1e3)
            ours_cpu.append([r["cpu"] for r in mine])
            torch_cpu.append([r["cpu"] for r in reps])
    return {"name": name, "torch": torch_class, "sched": sched, "job": job,
            "loss": first.loss, "torch_loss": sum(torch_losses) / len(torch_losses),
            "ref_loss": ref_loss, "err": first.max_grad_error, "torch_err": torch_err,
            "ours_ms": statistics.median(ours_ms), "torch_ms": statistics.median(torch_ms),
            "ours_cpu": _busiest(ours_cpu), "torch_cpu": _busiest(torch_cpu),
            # Round by round (step k of ours beside step k of torch's): is ours <= torch?
            "wall_verdict": _at_most(ours_ms, torch_ms),
            "cpu_verdict": _at_most([max(step) for step in ours_cpu],
                                    [max(step) for step in torch_cpu]),
            "spread": (_iqr(ours_ms), _iqr(torch_ms))}


def _busiest(per_step: list[list[float]]) -> float:
    """Milliseconds of CPU of the busiest rank (median over steps, rank by rank)."""
    return max(statistics.median(step[r] for step in per_step)
               for r in range(len(per_step[0]))) * 1e3


NOT_RESOLVABLE = "not resolvable at this load"


def _at_most(ours: list[float], theirs: list[float]) -> str:
    """'met' when ours is at most torch's in every counted step (pl.noise's rule: the extreme
    step on each side dropped), 'NOT met' when torch's is smaller in every one, otherwise not
    resolvable at this load."""
    v = pl.noise.verdict(ours, theirs, labels=("ours", "torch"), margin=0.0)
    low, _high = v.interval
    if low >= 1.0:
        return "met"
    return "NOT met" if v.faster == "torch" else NOT_RESOLVABLE


def _overall(verdicts: list[str]) -> str:
    if all(v == "met" for v in verdicts):
        return "met"
    return "NOT met" if "NOT met" in verdicts else NOT_RESOLVABLE


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


TIMING_HEAD = (f"{'wall ms':>9}{'torch':>8}{'ratio':>7}{'CPU ms':>8}{'torch':>7}{'ratio':>7}"
               f"  CPU <= torch's")


def _timing(r: dict) -> str:
    """A row's step time and CPU, each side's and the ratio ours/torch, and the CPU verdict."""
    return (f"{r['ours_ms']:>9.2f}{r['torch_ms']:>8.2f}{r['ours_ms'] / r['torch_ms']:>7.2f}"
            f"{r['ours_cpu']:>8.2f}{r['torch_cpu']:>7.2f}{r['ours_cpu'] / r['torch_cpu']:>7.2f}"
            f"  {r['cpu_verdict']}")


def print_rows(size: str, cfg, rows_per_mb: int, rows: list[dict]) -> None:
    print(f"\n{size}-bound: d_model {cfg.d_model}, {cfg.n_layers} blocks, microbatches of "
          f"{rows_per_mb} x {cfg.seq_len} tokens")
    print("wall: step time, median; CPU: thread CPU of the busiest rank in the same span, "
          "median (stable under load); ratios ours/torch")
    head = (f"{'schedule':<18}{'torch class':<31}{'loss ours':>10}{'torch':>9}{'ref':>9}"
            f"{'grad err':>9}{'torch':>8}" + TIMING_HEAD)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:<18}{r['torch']:<31}{r['loss']:>10.5f}{r['torch_loss']:>9.5f}"
              f"{r['ref_loss']:>9.5f}{r['err']:>9.1e}{r['torch_err']:>8.1e}"
              + _timing(r))


def exportable(ranks: int, microbatches: int, chunks: int,
               only: list[str] | None = None) -> list[pl.Schedule]:
    """Every registered schedule (or those in `only`) that torch's runtime can run as written."""
    out = []
    for name in pl.SCHEDULES:
        if only and name not in only:
            continue
        try:
            sched = our_schedule(name, ranks, microbatches, chunks)
            sched.to_torch_csv()
        except (ValueError, pl.ScheduleError):
            continue                                  # not expressible in torch (or this shape)
        out.append(sched)
    return out


def same_order(cluster, sched: pl.Schedule, cfg, batch: int, steps: int, warmup: int) -> dict:
    """One schedule on our runtime and on torch's, from the exported file, same workers."""
    bounds = pl.partition(cfg, sched.stages).bounds
    runs = {engine: cluster.run(sched, model=cfg, partition=bounds, batch_size=batch,
                                engine=engine, progress=False) for engine in ("pipelab", "torch")}
    specs = {engine: dataclasses.replace(res.spec, check=False) for engine, res in runs.items()}
    wall: dict[str, list] = {"pipelab": [], "torch": []}
    cpu: dict[str, list] = {"pipelab": [], "torch": []}
    for k in range(warmup + steps):                  # alternate: both see the same load
        for engine, spec in specs.items():
            reps = cluster.call(OURS_STEP, spec)
            if k >= warmup:
                wall[engine].append((max(r["end"] for r in reps) -
                                     min(r["begin"] for r in reps)) * 1e3)
                cpu[engine].append([r["cpu"] for r in reps])
    ours, theirs = runs["pipelab"], runs["torch"]
    return {"name": sched.name, "actions": sum(map(len, sched.actions)),
            "err": ours.max_grad_error, "torch_err": theirs.max_grad_error,
            "loss_err": abs(ours.loss - ours.reference_loss) / abs(ours.reference_loss),
            "torch_loss_err": abs(theirs.loss - theirs.reference_loss) / abs(theirs.reference_loss),
            "ours_ms": statistics.median(wall["pipelab"]), "torch_ms": statistics.median(wall["torch"]),
            "ours_cpu": _busiest(cpu["pipelab"]), "torch_cpu": _busiest(cpu["torch"]),
            "wall_verdict": _at_most(wall["pipelab"], wall["torch"]),
            "cpu_verdict": _at_most([max(step) for step in cpu["pipelab"]],
                                    [max(step) for step in cpu["torch"]])}


def print_same_order(size: str, cfg, rows_per_mb: int, rows: list[dict]) -> None:
    print(f"\nsame order, two runtimes ({size}-bound: d_model {cfg.d_model}, {cfg.n_layers} "
          f"blocks, microbatches of {rows_per_mb} x {cfg.seq_len} tokens): our runtime and "
          f"torch's _PipelineScheduleRuntime running the file to_torch_csv exported")
    head = (f"{'schedule':<18}{'actions':>8}{'grad err':>10}{'torch':>9}{'loss err':>10}"
            f"{'torch':>9}" + TIMING_HEAD)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:<18}{r['actions']:>8}{r['err']:>10.1e}{r['torch_err']:>9.1e}"
              f"{r['loss_err']:>10.1e}{r['torch_loss_err']:>9.1e}"
              + _timing(r))


def print_tables(sched: pl.Schedule, torch_class: str) -> None:
    """Our schedule and torch's private table, rank by rank, with what differs."""
    try:
        theirs = torch_table(torch_class, sched.ranks, sched.microbatches, sched.chunks)
    except Exception as err:                      # a private torch API: never fail the run on it
        print(f"\nnote: torch's table for {torch_class} could not be read: {err}")
        return
    print(f"\n{sched.name} (pipelab) vs {torch_class} (torch's pipeline_order), "
          f"{sched.ranks} ranks, {sched.microbatches} microbatches:")
    for rank in range(sched.ranks):
        ours = [str(a) for a in sched.actions[rank]]
        print(f"  rank {rank} ours : {' '.join(ours)}")
        print(f"  rank {rank} torch: {' '.join(theirs[rank])}")
        if ours == theirs[rank]:
            print("           same actions, same order")
            continue
        forwards = sorted({int(a.split("F")[1]) for a in theirs[rank] if "F" in a})
        if forwards and forwards != list(range(sched.microbatches)):
            print(f"           torch's table numbers this rank's forwards {forwards[0]}..{forwards[-1]}"
                  f", not 0..{sched.microbatches - 1}: a wart of torch 2.13's "
                  f"{torch_class}._get_pipeline_order (its runtime runs microbatches "
                  f"0..{sched.microbatches - 1}, as the matching losses above show)")
            continue
        if sorted(ours) == sorted(theirs[rank]):
            at = next(i for i, (a, b) in enumerate(zip(ours, theirs[rank])) if a != b)
            print(f"           same actions, different order from position {at} "
                  f"({ours[at]} vs {theirs[rank][at]})")
        else:
            print(f"           different actions: only ours {sorted(set(ours) - set(theirs[rank]))}, "
                  f"only torch {sorted(set(theirs[rank]) - set(ours))}")


def cpu_profile(cluster, row: dict, cfg, batch: int, steps: int, warmup: int) -> None:
    """Thread CPU per action, ours (sampled meter, full meter, no meter) and torch's."""
    sched, job = row["sched"], row["job"]
    spec = pl.runtime.prepare_run(sched, ranks=sched.ranks, model=cfg,
                                  partition=[tuple(b) for b in job["bounds"]],
                                  batch_size=batch, check=False)
    # The run's meter (sampled), the meter hooking every forward (the exactness reference),
    # no meter at all, and torch's, alternated.
    full = dataclasses.replace(spec, meter="full")
    runs: dict[str, list] = {"ours": [], "ours, full meter": [], "ours, no meter": [],
                             "torch": []}
    for k in range(warmup + steps):
        for label, call in (("ours", lambda: cluster.call(OURS_STEP, spec)),
                            ("ours, full meter", lambda: cluster.call(OURS_STEP, full)),
                            ("ours, no meter", lambda: cluster.call(OURS_STEP, spec,
                                                                    without=("meter",))),
                            ("torch", lambda: cluster.call(TORCH_STEP, job))):
            reps = call()
            if k >= warmup:
                runs[label].append(reps)
    print(f"\nCPU per action, {row['name']} at d_model {cfg.d_model} (thread time from the "
          f"barrier to the end of the step, median of {steps}; per rank):")
    for label, reps in runs.items():
        per = [statistics.median(r[rank]["cpu"] for r in reps) / reps[0][rank]["actions"] * 1e6
               for rank in range(sched.ranks)]
        print(f"  {label:<18}" + "".join(f"{x:9.0f} us" for x in per))
    prof = {"ours": cluster.call(OURS_STEP, spec, profile=True),
            "torch": cluster.call(TORCH_STEP, {**job, "profile": True})}
    print("  where it goes (thread-time cProfile of one step, own time per action, us; the "
          "profiler inflates Python-heavy rows):")
    cats = sorted({c for reps in prof.values() for rep in reps for c in rep["profile"]["categories"]})
    print(f"  {'':<30}" + "".join(f"{side + ' r' + str(r):>11}" for side in prof
                                  for r in range(sched.ranks)))
    for c in cats:
        cells = [rep["profile"]["categories"].get(c, 0.0) / rep["actions"] * 1e6
                 for side in prof for rep in prof[side]]
        print(f"  {c:<30}" + "".join(f"{x:11.1f}" for x in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=2, help="stages per rank where a "
                        "schedule takes chunks")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sizes", default="compute,overhead",
                        help=f"comma-separated, from: {', '.join(SIZES)}")
    parser.add_argument("--schedules", default="",
                        help=f"comma-separated, from: {', '.join(TORCH_PEERS)} (default: all)")
    parser.add_argument("--no-tables", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--same-order-only", action="store_true",
                        help="only the 'same order, two runtimes' table")
    args = parser.parse_args()
    if args.steps < 10:
        parser.error("--steps must be at least 10 (a median of fewer steps is noise)")
    unknown = [size for size in args.sizes.split(",") if size not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown size(s) {unknown}; choose from {', '.join(SIZES)}")
    only = [name for name in args.schedules.split(",") if name]
    unknown = [name for name in only if name not in TORCH_PEERS and name not in pl.SCHEDULES]
    if unknown:
        parser.error(f"--schedules: unknown {unknown}; choose from {', '.join(pl.SCHEDULES)}")
    load_before = os.getloadavg()
    comparable = [] if args.same_order_only else \
        pairs(args.ranks, args.microbatches, args.chunks, only)
    exported = exportable(args.ranks, args.microbatches, args.chunks, only)
    results, same = {}, []
    with pl.LocalCluster(args.ranks, timeout=120) as cluster:
        print(f"{args.ranks} ranks pinned to cores {cluster.cores}, {args.microbatches} "
              f"microbatches, uniform partition, median of {args.steps} steps after "
              f"{args.warmup} warm-up; both runtimes alternate in the same worker processes")
        for size in args.sizes.split(","):
            kwargs, rows_per_mb = SIZES[size]
            cfg = pl.ModelConfig(**kwargs)
            batch = rows_per_mb * args.microbatches
            if comparable:
                rows = [compare(cluster, name, sched, cls, style, cfg, batch, args.steps,
                                args.warmup) for name, sched, cls, style in comparable]
                results[size] = rows
                print_rows(size, cfg, rows_per_mb, rows)
                if args.profile:
                    for row in rows:
                        cpu_profile(cluster, row, cfg, batch, args.steps, args.warmup)
            rows = [same_order(cluster, sched, cfg, batch, args.steps, args.warmup)
                    for sched in exported]
            same += rows
            print_same_order(size, cfg, rows_per_mb, rows)
    load_after = os.getloadavg()
    if not args.no_tables:
        for name, sched, cls, _style in comparable:
            print_tables(sched, cls)
    print(f"\nload average (1, 5, 15 min): {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f} before, {load_after[0]:.1f} {load_after[1]:.1f} "
          f"{load_after[2]:.1f} after; wall-clock ratios need a quiet machine, CPU per action "
          f"(--profile) does not")
    exact = all(max(r["err"], r["torch_err"], r["loss_err"], r["torch_loss_err"]) <= 1e-5
                for r in same)
    print(f"same order, two runtimes: {len(same)} rows, both runtimes exact (<= 1e-5): "
          f"{'yes' if exact else 'NO'}; CPU per step ours <= torch's (judged step by step): "
          f"{_overall([r['cpu_verdict'] for r in same])} "
          f"({sum(r['cpu_verdict'] == 'met' for r in same)} met, "
          f"{sum(r['cpu_verdict'] == NOT_RESOLVABLE for r in same)} not resolvable); wall "
          f"{_overall([r['wall_verdict'] for r in same])}")
    every = [r for rows in results.values() for r in rows]
    if not every:
        return
    worst = max(r["ours_ms"] / r["torch_ms"] for r in every)
    worst_cpu = max(r["ours_cpu"] / r["torch_cpu"] for r in every)
    exact = all(r["err"] <= 1e-5 and r["torch_err"] <= 1e-5 for r in every)
    print(f"target CPU per step ours/torch <= 1.00 on every row, measuring on (judged step by "
          f"step): {_overall([r['cpu_verdict'] for r in every])} "
          f"({sum(r['cpu_verdict'] == 'met' for r in every)} of {len(every)} rows met, "
          f"{sum(r['cpu_verdict'] == NOT_RESOLVABLE for r in every)} not resolvable)")
    print(f"target ours/torch <= 1.00 for every schedule and size: wall "
          f"{_overall([r['wall_verdict'] for r in every])}, CPU "
          f"{_overall([r['cpu_verdict'] for r in every])} (worst {worst:.2f} wall, "
          f"{worst_cpu:.2f} CPU; load {os.getloadavg()[0]:.1f}); both gradient-exact "
          f"(<= 1e-5): {'yes' if exact else 'NO'}")


if __name__ == "__main__":
    main()
