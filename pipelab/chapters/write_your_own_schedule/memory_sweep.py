"""zb-auto across memory limits, against the hand-made schedules (notebook 13, the benchmark).

For one cost table, `memory_sweep` builds zb-auto at every memory limit asked for and simulates
it next to 1F1B, ZB-H1 and ZB-H2, reporting both objectives: the longest per-rank span (what the
zero-bubble paper minimises) and the wall-clock step (`makespan`). `ratio_grid` does the same at
ZB-H1's and ZB-H2's own memory over a grid of F : I : W ratios. Data first; `plot_memory_sweep`
only draws what `memory_sweep` returned.
"""
from __future__ import annotations

import itertools
from typing import Sequence

from ...sim.compare import longest_span
from ...schedules import schedule
from ...sim.costs import Costs
from ...sim.simulate import simulate

HAND_MADE = ("1f1b", "zb-h1", "zb-h2")


def _row(name: str, sched, costs: Costs, i_frees: float, limit=None) -> dict:
    tl = simulate(sched, costs, i_frees=i_frees)
    return {"name": name, "limit": limit, "span": longest_span(tl), "makespan": tl.makespan,
            "peak": max(tl.peak_activations().values()), "timeline": tl}


def memory_sweep(ranks: int, microbatches: int, costs: Costs, limits: Sequence[float], *,
                 i_frees: float = 0.0) -> dict:
    """{"auto": one row per limit, "hand": one row per hand-made schedule that builds}; each row
    has name, limit, span, makespan, peak (activations, microbatch-stages) and its timeline."""
    auto = [_row("zb-auto", schedule("zb-auto", ranks=ranks, microbatches=microbatches,
                                     costs=costs, memory_limit=k, i_frees=i_frees),
                 costs, i_frees, k) for k in limits]
    hand = []
    for name in HAND_MADE:
        try:
            sched = schedule(name, ranks=ranks, microbatches=microbatches)
        except ValueError:          # zb-h2 needs m >= 2p − 1
            continue
        hand.append(_row(name, sched, costs, i_frees))
    return {"auto": auto, "hand": hand}


def format_sweep(sweep: dict) -> str:
    lines = [f"{'schedule':10}{'limit':>7}{'peak':>7}{'span':>9}{'step':>9}"]
    for r in sweep["hand"] + sweep["auto"]:
        limit = "" if r["limit"] is None else f"{r['limit']:g}"
        lines.append(f"{r['name']:10}{limit:>7}{r['peak']:>7.3g}{r['span']:>9.4g}"
                     f"{r['makespan']:>9.4g}")
    return "\n".join(lines)


def plot_memory_sweep(sweep: dict, ax=None, title: str = "") -> object:
    """zb-auto's span and step against its memory limit (lines), the hand-made schedules at
    their own peak memory (points)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _fig, ax = plt.subplots(figsize=(8, 3.6))
    limits = [r["limit"] for r in sweep["auto"]]
    ax.plot(limits, [r["span"] for r in sweep["auto"]], "o-", color="C0",
            label="zb-auto: longest per-rank span")
    ax.plot(limits, [r["makespan"] for r in sweep["auto"]], "s--", color="C0", alpha=0.5,
            label="zb-auto: wall-clock step")
    for i, r in enumerate(sweep["hand"]):
        ax.plot([r["peak"]], [r["span"]], "D", color=f"C{i + 1}", markersize=9,
                label=f"{r['name']} (span {r['span']:.4g}, step {r['makespan']:.4g})")
    ax.set_xlabel("memory limit / peak activations (microbatch-stages per rank)")
    ax.set_ylabel("time")
    ax.set_title(title or "zb-auto against the hand-made schedules — simulated", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    return ax


def ratio_grid(ranks: int, microbatches: int, ratios: Sequence[float] = (0.5, 1.0, 2.0),
               comms: Sequence[float] = (0.0, 0.3), *, i_frees: float = 0.0) -> list[dict]:
    """For every F : I : W in `ratios`³ and every message latency, one row: {F, I, W, comm,
    h1, auto_p, h2, auto_2p1}, each of the last four {span, makespan, peak, limit} — zb-auto
    given exactly the peak memory ZB-H1 reaches (p) and ZB-H2 reaches (2p − 1), next to them
    (no h2 / auto_2p1 when m < 2p − 1)."""
    hand = {"h1": schedule("zb-h1", ranks=ranks, microbatches=microbatches)}
    if microbatches >= 2 * ranks - 1:
        hand["h2"] = schedule("zb-h2", ranks=ranks, microbatches=microbatches)
    rows = []
    for (f, i, w), comm in itertools.product(itertools.product(ratios, repeat=3), comms):
        costs = Costs(F=f, I=i, W=w, comm=comm)
        row = {"F": f, "I": i, "W": w, "comm": comm}
        for key, sched in hand.items():
            mine = _row(key, sched, costs, i_frees)
            auto = schedule("zb-auto", ranks=ranks, microbatches=microbatches, costs=costs,
                            memory_limit=mine["peak"], i_frees=i_frees)
            theirs = _row(key, auto, costs, i_frees, mine["peak"])
            auto_key = "auto_p" if key == "h1" else "auto_2p1"
            for k, r in ((key, mine), (auto_key, theirs)):
                row[k] = {name: r[name] for name in ("span", "makespan", "peak", "limit")}
        rows.append(row)
    return rows
