"""V-Half and V-Min against 1F1B, ZB-H1 and ZB-V: memory and bubble, simulated and live.

    python benchmarks/v_shape.py [--no-live]

Part 1 (simulated): for p = 4 and 8, m = 2p and 4p, and F : I : W in 1:1:1, 1:1.5:0.5, 1:2:1,
1.2:1:0.8, each schedule's peak activations per rank (microbatches of a rank's layers), its
bubble (1 − work / longest per-rank span, the zero-bubble papers' rate) and the closed forms
(`pipelab.views.memory_bubble.CLOSED`; "-" where none holds for those costs).

Part 2 (live, p = 2, m = 4): each schedule once on two worker processes after a discarded
warm-up run: exactness against the unsplit model, the meter's peak activation bytes per rank,
the simulated peaks beside them, and the wall-clock step with the load average (one run on a
shared machine: a figure to read, not to compare closely).
"""
from __future__ import annotations

import argparse

import pipelab as pl
from pipelab.support import noise
from pipelab.views.memory_bubble import NAMES, memory_bubble_table

RATIOS = [(1, 1, 1), (1, 1.5, 0.5), (1, 2, 1), (1.2, 1, 0.8)]


def _closed(value, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if percent else f"{value:g}"


def simulated_part() -> None:
    head = (f"{'schedule':<8}{'p':>3}{'m':>4}  {'F:I:W':<12}{'peak per rank':<34}"
            f"{'bubble':>8}{'closed peak':>13}{'closed bubble':>15}")
    print(head)
    print("-" * len(head))
    for p in (4, 8):
        for m in (2 * p, 4 * p):
            for F, I, W in RATIOS:
                costs = pl.Costs(F=F, I=I, W=W)
                for r in memory_bubble_table(p, m, costs):
                    peaks = " ".join(f"{v:g}" for v in r["peaks"])
                    print(f"{r['name']:<8}{p:>3}{m:>4}  {f'{F:g}:{I:g}:{W:g}':<12}{peaks:<34}"
                          f"{100 * r['bubble']:>7.1f}%{_closed(r['closed_peak']):>13}"
                          f"{_closed(r['closed_bubble'], True):>15}")
            print()


def live_part() -> None:
    p, m = 2, 4
    cfg = pl.ModelConfig(n_layers=4, d_model=128, n_heads=4, seq_len=32)
    print(f"live, p={p}, m={m}, d_model={cfg.d_model}, {cfg.n_layers} layers, uniform split")
    print(f"{'schedule':<8}{'exact':>7}{'max grad err':>14}{'peak MiB per rank':>22}"
          f"{'simulated peak':>16}{'step ms':>10}")
    with pl.LocalCluster(p) as cluster:
        for name in NAMES:
            sched = pl.schedule(name, ranks=p, microbatches=m)
            cluster.run(sched, model=cfg, seed=0)                   # warm-up, discarded
            res = cluster.run(sched, model=cfg, seed=0)
            exact = res.max_grad_error <= 1e-5 and \
                abs(res.loss - res.reference_loss) <= 1e-6 * abs(res.reference_loss)
            measured = " ".join(f"{res.peak_activations[r] / 2**20:.3f}" for r in range(p))
            simulated = " ".join(f"{v:g}" for v in pl.simulate(sched).peak_activations().values())
            print(f"{name:<8}{str(exact):>7}{res.max_grad_error:>14.2e}{measured:>22}"
                  f"{simulated:>16}{res.timeline.makespan * 1e3:>10.1f}")
    print(f"(wall clock of one run each, {noise.load_line()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-live", action="store_true", help="skip the live part")
    args = parser.parse_args()
    simulated_part()
    if not args.no_live:
        live_part()


if __name__ == "__main__":
    main()
