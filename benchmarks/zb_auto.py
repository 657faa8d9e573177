"""zb-auto against ZB-H1 and ZB-H2: a grid of F : I : W ratios, then costs fitted from a live run.

    python benchmarks/zb_auto.py [--ranks 4] [--microbatches 8] [--quick] [--no-live]

Part 1 (simulated): for each F : I : W in {0.5, 1, 2}³ and message latency 0 or 0.3, the
longest per-rank span (the paper's objective) and the wall-clock step of ZB-H1, zb-auto at
ZB-H1's memory p, ZB-H2, and zb-auto at ZB-H2's 2p − 1 (memory: W frees what F stored, I
nothing; `--i-frees` changes that). Targets: zb-auto's span ≤ ZB-H1's on every row; within 3%
of ZB-H2's span where comm ≤ 0.3 (the tests' grid). With comm = 1 (a message as slow as a
forward) the greedy, like the authors' own, falls up to ~5% behind ZB-H2: printed per comm.

Part 2 (live): the toy model runs ZB-H1 on p worker processes; F, I, W per stage and the
message latency are fitted from its measured CPU times (`compare.fit_costs`), and the share of
a forward's activations that I frees is measured with the saved-tensors meter. zb-auto is built
from those at limits p … 2p and simulated next to the hand-made schedules; the one at p + 1 runs
live and is checked against the unsplit model.
"""
from __future__ import annotations

import argparse
import os

import pipelab as pl
from pipelab.views import compare
from pipelab.chapters.write_your_own_schedule import memory_sweep


def grid_table(ranks: int, microbatches: int, ratios, comms, i_frees: float) -> None:
    rows = memory_sweep.ratio_grid(ranks, microbatches, ratios, comms, i_frees=i_frees)
    has_h2 = "h2" in rows[0]
    keys = ["h1", "auto_p"] + (["h2", "auto_2p1"] if has_h2 else [])
    head = f"{'F':>4}{'I':>5}{'W':>5}{'comm':>6} |" + "".join(f"{k + ' span/step':>20}" for k in keys)
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = "".join(f"{r[k]['span']:>10.4g}/{r[k]['makespan']:<9.4g}" for k in keys)
        print(f"{r['F']:>4g}{r['I']:>5g}{r['W']:>5g}{r['comm']:>6g} |{cells}")
    not_worse = sum(r["auto_p"]["span"] <= r["h1"]["span"] + 1e-9 for r in rows)
    shorter = sum(r["auto_p"]["makespan"] < r["h1"]["makespan"] - 1e-9 for r in rows)
    longer = sum(r["auto_p"]["makespan"] > r["h1"]["makespan"] + 1e-9 for r in rows)
    h1_memory = rows[0]["auto_p"]["limit"]
    print(f"\nat ZB-H1's memory ({h1_memory:g}): zb-auto's span <= ZB-H1's on {not_worse}/{len(rows)} "
          f"rows; wall-clock step shorter on {shorter}, longer on {longer}")
    if has_h2:
        for comm in comms:
            gaps = sorted(r["auto_2p1"]["span"] / r["h2"]["span"] - 1
                          for r in rows if r["comm"] == comm)
            print(f"at ZB-H2's memory ({rows[0]['auto_2p1']['limit']:g}), comm {comm:g}: "
                  f"zb-auto's span vs "
                  f"ZB-H2's {gaps[0]:+.1%} … {gaps[-1]:+.1%} (median {gaps[len(gaps) // 2]:+.1%})")


def live_part(ranks: int, microbatches: int, quick: bool) -> None:
    cfg = pl.ModelConfig(n_layers=2 * ranks, d_model=64 if quick else 128, n_heads=4, seq_len=32)
    with pl.LocalCluster(ranks) as cluster:
        h1 = pl.schedule("zb-h1", ranks=ranks, microbatches=microbatches)
        cluster.run(h1, model=cfg, seed=0)                       # warm-up, discarded
        first = cluster.run(h1, model=cfg, seed=0)
        costs = compare.fit_costs(first)
        print(f"\nlive ZB-H1, p={ranks}, m={microbatches}, d_model={cfg.d_model} (load "
              f"{os.getloadavg()[0]:.2f}): fitted per stage (ms) F "
              f"{[round(v * 1e3, 2) for v in costs.F]} I {[round(v * 1e3, 2) for v in costs.I]}"
              f" W {[round(v * 1e3, 2) for v in costs.W]}; message {costs.comm * 1e6:.0f} us; "
              f"I frees {first.i_frees:.3f} of a forward's activations")
        sweep = memory_sweep.memory_sweep(ranks, microbatches, costs,
                                          list(range(ranks, 2 * ranks + 1)),
                                          i_frees=first.i_frees)
        print("simulated with the fitted costs (times in s):")
        print(memory_sweep.format_sweep(sweep))
        auto = pl.schedule("zb-auto", ranks=ranks, microbatches=microbatches, costs=costs,
                           memory_limit=ranks + 1, i_frees=first.i_frees)
        res = cluster.run(auto, model=cfg, seed=0)
        predicted = pl.simulate(auto, costs, i_frees=first.i_frees)
        print(f"zb-auto (limit {ranks + 1}) live: max grad error {res.max_grad_error:.1e}; "
              f"step predicted {predicted.makespan * 1e3:.2f} ms, replayed "
              f"{res.replay.makespan * 1e3:.2f} ms, measured {res.timeline.makespan * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--i-frees", type=float, default=0.0)
    parser.add_argument("--quick", action="store_true", help="fewer ratios, a smaller model")
    parser.add_argument("--no-live", action="store_true", help="the simulated grid only")
    args = parser.parse_args()
    ratios = (0.5, 1.0, 2.0) if args.quick else (0.5, 1.0, 1.5, 2.0)
    comms = (0.0, 0.3) if args.quick else (0.0, 0.3, 1.0)
    print(f"load average {os.getloadavg()[0]:.2f}; p={args.ranks}, m={args.microbatches}, "
          f"I frees {args.i_frees:g} (simulated)\n")
    grid_table(args.ranks, args.microbatches, ratios, comms, args.i_frees)
    if not args.no_live:
        live_part(args.ranks, args.microbatches, args.quick)


if __name__ == "__main__":
    main()
