"""Memory against bubble for the zero-bubble family: 1F1B, ZB-H1, ZB-V, V-Half, V-Min (notebook
05, benchmarks/v_shape.py). `memory_bubble_table` simulates and puts each schedule's closed
forms beside it; `plot_memory_bubble` only draws that table.

Bubble here is the zero-bubble papers' rate, 1 − work / longest per-rank span (the span, not the
wall clock: docs/formulas.md). Peaks are microbatches of a rank's layers on the busiest rank.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..sim.compare import longest_span
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..schedules.registry import schedule

NAMES = ("1f1b", "zb-h1", "zb-v", "v-half", "v-min")


def _equal(c: Costs) -> bool:
    return c.F == c.I == c.W


# Closed forms: (peak of the busiest rank, idle time of a rank's span), or None where a form
# does not hold. Sources: 1F1B Megatron-LM §2.2.1; ZB-H1 and ZB-V Zero Bubble (arXiv
# 2401.10241) Table 2 and §6; V-Half and V-Min Controllable Memory (arXiv 2405.15362), the
# authors' README: ⌊(p+2)/2⌋ and ⌊(p+4)/3⌋ microbatches, about ½ and ⅔ of 1F1B's bubble at
# F = I = W (approximations: ours sit a little below them, tests/test_v_shape.py).
CLOSED: dict[str, Callable[[int, Costs], tuple[float, float | None]]] = {
    "1f1b": lambda p, c: (p, (p - 1) * (c.F + c.I + c.W)),
    "zb-h1": lambda p, c: (p, (p - 1) * (c.F + c.I - c.W)),
    "zb-v": lambda p, c: (p, 0.0 if _equal(c) else None),
    "v-half": lambda p, c: ((p + 2) // 2, (p - 1) * (c.F + c.I + c.W) / 2 if _equal(c) else None),
    "v-min": lambda p, c: ((p + 4) // 3, 2 * (p - 1) * (c.F + c.I + c.W) / 3 if _equal(c) else None),
}


def memory_bubble_table(ranks: int, microbatches: int, rank_costs: Costs | None = None,
                        names: Sequence[str] = NAMES) -> list[dict]:
    """One row per schedule, simulated (costs per rank's worth of layers): `peak` (busiest
    rank), `peaks` (every rank), `span`, `makespan`, `bubble` (1 − work/span), and the closed
    forms `closed_peak`, `closed_bubble` (None where no form holds for these costs)."""
    costs = rank_costs or Costs(F=1.0, I=1.0, W=1.0)
    work = microbatches * (costs.F + costs.I + costs.W)
    rows = []
    for name in names:
        tl = simulate(schedule(name, ranks=ranks, microbatches=microbatches), costs)
        peaks = tl.peak_activations()
        span = longest_span(tl)
        closed_peak, closed_idle = CLOSED[name](ranks, costs) if name in CLOSED else (None, None)
        rows.append({"name": name, "peak": max(peaks.values()),
                     "peaks": [peaks[r] for r in range(ranks)], "span": span,
                     "makespan": tl.makespan, "bubble": 1 - work / span,
                     "closed_peak": closed_peak,
                     "closed_bubble": None if closed_idle is None
                     else closed_idle / (work + closed_idle)})
    return rows


def plot_memory_bubble(rows: list[dict], ax=None, title: str | None = None):
    """Each schedule's simulated (peak, bubble) as a filled dot, its closed form as a hollow
    one joined to it by a thin line. Only draws."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    palette = plt.get_cmap("tab10").colors
    for k, r in enumerate(rows):
        colour = palette[k % len(palette)]
        ax.plot(r["peak"], 100 * r["bubble"], "o", markersize=8, color=colour)
        ax.annotate(r["name"], (r["peak"], 100 * r["bubble"]), textcoords="offset points",
                    xytext=(7, 4), fontsize=9, color=colour)
        if r["closed_peak"] is not None and r["closed_bubble"] is not None:
            ax.plot(r["closed_peak"], 100 * r["closed_bubble"], "o", markersize=11,
                    markerfacecolor="none", color=colour)
            ax.plot([r["peak"], r["closed_peak"]], [100 * r["bubble"], 100 * r["closed_bubble"]],
                    "-", lw=0.8, color=colour)
    ax.plot([], [], "o", color="grey", label="simulated")
    ax.plot([], [], "o", markerfacecolor="none", color="grey", label="closed form")
    ax.set_xlabel("peak activations, busiest rank (microbatches × a rank's layers)")
    ax.set_ylabel("bubble (% of the longest rank's span)")
    ax.set_xlim(0, max(r["peak"] for r in rows) * 1.3)
    ax.set_ylim(-2, max(100 * max(r["bubble"], r["closed_bubble"] or 0) for r in rows) * 1.2 + 2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title or "memory against bubble — simulated, closed forms hollow", fontsize=10)
    return ax
