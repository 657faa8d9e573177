"""STP against 1F1B-I and ZB-V on 2 pipeline ranks × 2 tensor-parallel shards, and beyond.

    python benchmarks/stp.py [--quick] [--d-model 64] [--layers 4] [--steps 3] [--grids 2,4,8]
                             [--link-fraction 0.5]

Part 1 runs each schedule live on a LocalCluster of 4 processes (`tensor_parallel=2`) and
prints the measured step time (median over steps after the first), the replay (the schedule
re-run in the simulator at each action's measured CPU time) and the reference check. Part 2
takes unit costs measured in the ZB-V run, whose F, I and W all run alone — T_F, T_I, T_W per
chunk (a pass's span less the tensor-parallel all-reduces it waited for) and T_AR (the
all-reduces of one pass, summed) — and simulates the three schedules on larger grids (p ranks,
m = 3p), with the measured T_AR and with T_AR at a few fractions of T_F.

Part 3 is the race on an emulated link (`pl.Link`): its latency is chosen so that one pass's
tensor-parallel all-reduces (T_AR, two ring all-reduces of one activation per block) take
`--link-fraction` of the forward measured in Part 1 (at least a quarter, the regime where STP's
braiding matters), and the three schedules run live on it. The ranks sleep through the link's
waits, so communication shows on two cores as on a cluster: measured, replayed (each action's
CPU time, communication priced by the link) and simulated (median costs, the same link)
makespans side by side, and whether the measured order is the simulated race's; where it is
not, each pair that swapped places with its gaps (simulated, measured, replayed) and the spread
of its measured steps. On a toy model the link's latency is a fraction of a millisecond, which
a loaded machine's scheduling delays match: `--d-model 256 --link-fraction 1` lets the link
dominate them.

Part 4 is STP's memory variant, activation offload (`pl.schedule("stp", ..., offload=f)`, f = 0,
0.5, 1) at the authors' figure's m = 9, live on the same grid: measured peak activation bytes
per rank and the bytes held off the device (counted apart), the makespans (measured, replayed,
and simulated with the copies on each rank's copy lane at their measured time), whether the
gradients are bit-identical to plain STP's; then, simulated with unit costs, the peak in chunk
units and the makespan as a copy grows from free to twice a forward (where the lane binds).
`--offload-only` runs just this part.

1F1B-I is the paper's interleaved 1F1B (2 chunks per rank, `interleaved-1f1b`).
"""
from __future__ import annotations

import argparse
import os
import statistics

import pipelab as pl
from pipelab.bench.load import load_average
from pipelab.model.memory import _blocks
from pipelab.chapters import tensor_and_pipeline as tensor_view

LIVE = {"STP": "stp", "ZB-V": "zb-v", "1F1B-I": "interleaved-1f1b"}
OFFLOAD = (0.0, 0.5, 1.0)          # shares of chunk-0 microbatches offloaded (Part 4)
OFFLOAD_M = 9                      # the authors' offload figure: p = 2, m = 9


def race(cfg, args, link=None) -> dict:
    """The three contenders live on a 2 × 2 grid (2 stages × 2 tensor shards), one run each."""
    runs = {}
    with pl.LocalCluster(ranks=4, timeout=120) as cluster:
        for label, name in LIVE.items():
            s = pl.schedule(name, ranks=2, microbatches=args.microbatches)
            runs[label] = cluster.run(s, model=cfg, tensor_parallel=2, steps=args.steps,
                                      link=link, progress=False)
    return runs


def unit_costs(res) -> tuple[pl.Costs, float]:
    """(F, I, W medians per chunk, compute only) and T_AR per pass, from a live run's last step."""
    waited: dict = {}
    for rank, entries in res.tp_all_reduces.items():
        for part, start, end, what in entries:
            if what != "forward, async":          # the ones the compute stood still for
                waited[(rank, part)] = waited.get((rank, part), 0.0) + (end - start)
    spans = {"F": [], "I": [], "W": []}
    per_pass = []
    for e in res.timeline.events:
        if len(e.action.parts) == 1 and e.action.kind in ("F", "I", "W"):
            ar = waited.get((e.rank, e.action), 0.0)
            spans[e.action.kind].append(e.duration - ar)
            if ar:
                per_pass.append(ar)
    med = {k: statistics.median(v) if v else 0.0 for k, v in spans.items()}
    return (pl.Costs.per_stage(F=med["F"], I=med["I"], W=med["W"], unit="s"),   # one chunk's
            statistics.median(per_pass) if per_pass else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small model, 2 steps, grids 2,4")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=6)
    ap.add_argument("--grids", default="2,4,8")
    ap.add_argument("--link-fraction", type=float, default=0.5,
                    help="T_AR of the emulated link as a share of T_F (>= 0.25)")
    ap.add_argument("--offload-only", action="store_true", help="run Part 4 only")
    args = ap.parse_args()
    if args.quick:
        args.d_model, args.steps, args.grids = 32, 2, "2,4"
    cfg = pl.ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=4, seq_len=32)
    if args.offload_only:
        offload_rows(cfg, args)
        return
    print(f"load average {load_average(1)} on {os.cpu_count()} cores; "
          f"model d={cfg.d_model}, {cfg.n_layers} blocks; 2 ranks × 2 shards, "
          f"m={args.microbatches}")
    runs = race(cfg, args)
    print(f"\n{'schedule':8}{'measured ms':>13}{'replayed ms':>13}{'TP all-reduce ms':>18}"
          f"{'max grad err':>14}")
    for label, res in runs.items():
        later = res.timelines[1:] or res.timelines
        measured = statistics.median(t.makespan for t in later)
        tp = sum(e.duration for e in res.timeline.comm_events()) / 2
        print(f"{label:8}{measured * 1e3:13.1f}{res.replay.makespan * 1e3:13.1f}"
              f"{tp * 1e3:18.1f}{res.max_grad_error:14.1e}")
    costs, t_ar = unit_costs(runs["ZB-V"])
    print(f"\nunit costs from the ZB-V run (compute only, per chunk): F {costs.F * 1e3:.2f} ms, "
          f"I {costs.I * 1e3:.2f} ms, W {costs.W * 1e3:.2f} ms; T_AR {t_ar * 1e3:.2f} ms per pass")
    print(f"\n{'T_AR':>14}{'p':>3}{'m':>4}" + "".join(f"{k + ' ms':>12}" for k in LIVE)
          + f"{'STP gain':>11}   (simulated)")
    for label, ar in [("measured", t_ar)] + [(f"{f:g} × T_F", f * costs.F) for f in (0.1, 0.25, 0.5)]:
        for p in map(int, args.grids.split(",")):
            tls = tensor_view.compare_tp(p, 3 * p, ar, costs)
            spans = {k: tl.makespan for k, tl in tls.items()}
            gain = min(spans["ZB-V"], spans["1F1B-I"]) / spans["STP"] - 1
            print(f"{label:>14}{p:3}{3 * p:4}" + "".join(f"{spans[k] * 1e3:12.1f}" for k in LIVE)
                  + f"{gain:11.1%}")
    link_race(cfg, args, costs.F)
    offload_rows(cfg, args)


def link_for(cfg: pl.ModelConfig, args, t_f: float,
             bandwidth: float = 1e9) -> tuple[pl.Link, float]:
    """The link whose T_AR (per pass: 2 ring all-reduces of one activation per block, over
    the 2 shards) is `args.link_fraction` × `t_f` on a stage of the median block count; and
    that T_AR."""
    sched = pl.schedule("zb-v", ranks=2, microbatches=args.microbatches)
    bounds = pl.partition(cfg, stages=sched.stages).bounds
    blocks = statistics.median(_blocks(cfg, a, b) for a, b in bounds) or 1
    rows = 2                           # the runs' default batch: 2 rows per microbatch
    nbytes = 4 * rows * cfg.seq_len * cfg.d_model
    per_all_reduce = args.link_fraction * t_f / (2 * blocks)
    # a ring of 2: 2 rounds, each one latency and half the bytes
    link = pl.Link(latency=max(0.0, (per_all_reduce - nbytes / bandwidth) / 2),
                   bandwidth=bandwidth)
    return link, 2 * blocks * link.allreduce_time(nbytes, 2)


def link_race(cfg: pl.ModelConfig, args, t_f: float) -> None:
    """Part 3: the three schedules live on an emulated link (module docstring)."""
    if args.link_fraction < 0.25:
        raise SystemExit("--link-fraction must be at least 0.25 (a quarter of a forward)")
    link, t_ar = link_for(cfg, args, t_f)
    print(f"\nPart 3: the race on an emulated {link} (T_AR {t_ar * 1e3:.2f} ms per pass = "
          f"{t_ar / t_f:.2f} × T_F {t_f * 1e3:.2f} ms); {load_average(1)} load average at start")
    runs = race(cfg, args, link)
    print(f"{'schedule':8}{'measured ms':>13}{'replayed ms':>13}{'simulated ms':>14}"
          f"{'max grad err':>14}   (measured: median of the steps after the first)")
    figures = {}
    for label, res in runs.items():
        later = res.timelines[1:] or res.timelines
        measured = statistics.median(t.makespan for t in later)
        figures[label] = (measured, res.replay.makespan, res.simulated.makespan)
        print(f"{label:8}" + "".join(f"{v * 1e3:13.1f}" for v in figures[label][:2])
              + f"{figures[label][2] * 1e3:14.1f}{res.max_grad_error:14.1e}")
    order = {source: sorted(figures, key=lambda k: figures[k][i])
             for i, source in enumerate(("measured", "replayed", "simulated"))}
    for source, ranked in order.items():
        print(f"{source:>10} order: " + " < ".join(ranked))
    same = order["measured"] == order["simulated"]
    print(f"the measured order {'matches' if same else 'differs from'} the simulated race; "
          f"load average {load_average(1)} at the end on {os.cpu_count()} cores")
    for a, b in ((a, b) for a in figures for b in figures if a < b):
        measured_gap = figures[a][0] / figures[b][0] - 1
        simulated_gap = figures[a][2] / figures[b][2] - 1
        if (measured_gap < 0) != (simulated_gap < 0):     # this pair swapped places
            print(f"  {a} / {b}: simulated {simulated_gap:+.1%}, measured {measured_gap:+.1%}, "
                  f"replayed {figures[a][1] / figures[b][1] - 1:+.1%} (steps measured: "
                  f"{a} {_spread(runs[a])}, {b} {_spread(runs[b])})")


def offload_rows(cfg: pl.ModelConfig, args) -> None:
    """Part 4: STP with activation offload, live on 2 × 2 and simulated (module docstring)."""
    print(f"\nPart 4: STP with activation offload, 2 ranks × 2 shards, m={OFFLOAD_M}; "
          f"load average {load_average(1)} at start")
    with pl.LocalCluster(ranks=4, timeout=120) as cluster:
        runs = {f: cluster.run(pl.schedule("stp", ranks=2, microbatches=OFFLOAD_M, offload=f),
                               model=cfg, tensor_parallel=2, steps=args.steps, progress=False)
                for f in OFFLOAD}
    plain = runs[0.0]
    print(f"{'offload':>8}{'peak r0 KiB':>13}{'peak r1 KiB':>13}{'off r0 KiB':>12}"
          f"{'r0 vs plain':>13}{'measured ms':>13}{'replayed ms':>13}{'simulated ms':>14}"
          f"{'max grad err':>14}{'= plain':>9}")
    for f, res in runs.items():
        later = res.timelines[1:] or res.timelines
        peak, off = res.peak_activations, res.offloaded_bytes
        print(f"{f:8g}{peak[0] / 1024:13.1f}{peak[1] / 1024:13.1f}{off[0] / 1024:12.1f}"
              f"{peak[0] / plain.peak_activations[0]:13.1%}"
              f"{statistics.median(t.makespan for t in later) * 1e3:13.1f}"
              f"{res.replay.makespan * 1e3:13.1f}{res.simulated.makespan * 1e3:14.1f}"
              f"{res.max_grad_error:14.1e}{str(res.grad_errors == plain.grad_errors):>9}")
    copy_ms = statistics.median(e.duration for e in runs[1.0].timeline.side_events("copy"))
    print(f"(a measured copy: {copy_ms * 1e3:.3f} ms median; {load_average(1)} load average "
          f"at the end)")
    print(f"\nsimulated, F = I = W = 1 per chunk, p=2, m={OFFLOAD_M}: rank-0 peak (rank units) "
          f"and makespan as one copy costs c × F")
    print(f"{'offload':>8}{'peak r0':>9}" + "".join(f"{f'c={c:g}':>9}" for c in (0, 0.5, 1, 2)))
    for f in OFFLOAD:
        s = pl.schedule("stp", ranks=2, microbatches=OFFLOAD_M, offload=f)
        tls = [pl.simulate(s, pl.Costs.per_stage(F=1, I=1, W=1, activation_bytes=c,
                                                 offload_bandwidth=1.0)) for c in (0, 0.5, 1, 2)]
        print(f"{f:8g}{tls[0].peak_activations()[0]:9.2f}"
              + "".join(f"{tl.makespan:9.1f}" for tl in tls))


def _spread(res) -> str:
    """The measured makespans of a run's steps after the first, in ms, lowest to highest."""
    later = res.timelines[1:] or res.timelines
    return "–".join(f"{t * 1e3:.0f}" for t in (min(x.makespan for x in later),
                                                max(x.makespan for x in later)))


if __name__ == "__main__":
    main()
