"""Chapter 06 helpers: closed forms of the bidirectional schedules, the bubble / activation /
weight table, its picture, and the sliders. The schedules themselves live in
schedules/dualpipe.py and schedules/chimera.py; routes and weight replicas in
schedules/routes.py and schedules/reductions.py.
"""
from __future__ import annotations

from typing import Sequence

from ..sim.compare import schedule_table, simulate_named
from ..sim.costs import Costs
from ..views import ui
from ..views.compare import against_1f1b, cost_slider as slider

#: The schedules chapter 06 compares: one direction, zero bubble, and the two directions.
NAMES = ("1f1b", "zb-h1", "zb-v", "chimera", "dualpipe", "dualpipe-v")


def pair_cost(F: float, B: float, overlap: float | None = None) -> float:
    """An overlapped F&B step: F + B on a CPU (overlap None), max(F, B) + overlap on a GPU."""
    return F + B if overlap is None else max(F, B) + overlap


def dualpipe_bubble(stages: int, F: float, I: float, W: float,  # noqa: E741
                    overlap: float | None = None) -> float:
    """DeepSeek-V3's table: (PP/2 − 1)(F&B + B − 3W), PP the number of stages (p for DualPipe,
    2p for DualPipeV on p ranks), B = I + W the full backward. The idle time of the rank that
    waits most. It counts DeepSeek's figure, where a forward and an input-gradient pass take
    the same time: the simulated schedule (DeepSeek's order, action for action) gives exactly
    this whenever F = I and W ≤ I, and something else otherwise (p=4, F:I:W = 1:1.5:0.5: 3, not
    3.5; 2:1:1: 4, not 3)."""
    B = I + W
    return (stages / 2 - 1) * (pair_cost(F, B, overlap) + B - 3 * W)


def chimera_bubble_fraction(ranks: int, microbatches: int) -> float:
    """Chimera's slot count: (p − 2)/(2m + p − 2) of the makespan, with equal F and B slots
    (the basic unit, and direct concatenation of units)."""
    return (ranks - 2) / (2 * microbatches + ranks - 2)


def chimera_doubling_bubble_fraction(ranks: int, microbatches: int) -> float:
    """The same count for forward doubling at B = 2F, where a slot is one backward or one
    doubled forward: each rank is busy 3m/2 slots and idles p − 2, (p − 2)/(3m/2 + p − 2) of the
    makespan (m a multiple of 2p)."""
    return (ranks - 2) / (1.5 * microbatches + ranks - 2)


#: Chimera's scaling against the one-direction and the paired baselines: (label, name, options).
SCALING_ROWS = (("chimera (doubling)", "chimera", {"scaling": "doubling"}),
                ("chimera (concat)", "chimera", {"scaling": "concat"}),
                ("1f1b", "1f1b", {}), ("dualpipe", "dualpipe", {}))


def backward_costs(backward: float, forward: float = 1.0) -> Costs:
    """Costs per rank's worth of layers with a full backward B = `backward` (I = W = B/2)."""
    return Costs(F=forward, I=backward / 2, W=backward / 2)


def chimera_scaling_table(ranks: int = 4, microbatches: Sequence[int] = (8, 16, 32),
                          backwards: Sequence[float] = (2.0, 1.0)) -> list[dict]:
    """Simulated rows for SCALING_ROWS at each m and each B (F = 1): `makespan`, `bubble` (idle
    share of the makespan), `idle` (the worst rank's idle time) and `peak` (the busiest rank's
    activations, microbatches × a rank's layers). A refused setting gets `error` instead."""
    rows = []
    for backward in backwards:
        costs = backward_costs(backward)
        for m in microbatches:
            for label, name, options in SCALING_ROWS:
                row = {"schedule": label, "m": m, "B/F": backward}
                try:
                    tl = simulate_named(name, ranks, m, costs, **options)
                except ValueError as error:
                    row["error"] = str(error)
                else:
                    row.update(makespan=tl.makespan, bubble=tl.bubble_fraction(),
                               idle=worst_idle(tl), peak=max(tl.peak_activations().values()))
                rows.append(row)
    return rows


def format_scaling_table(rows: list[dict]) -> str:
    """`chimera_scaling_table`'s rows as text, one line each."""
    lines = [f"{'B/F':>4} {'m':>3}  {'schedule':<20}{'makespan':>9}{'bubble':>8}{'idle':>6}"
             f"{'peak':>6}"]
    for r in rows:
        head = f"{r['B/F']:>4.3g} {r['m']:>3}  {r['schedule']:<20}"
        lines.append(head + (f"refused: {r['error'][:60]}" if "error" in r else
                             f"{r['makespan']:>9.4g}{r['bubble']:>8.1%}{r['idle']:>6.3g}"
                             f"{r['peak']:>6.3g}"))
    return "\n".join(lines)


def worst_idle(timeline) -> float:
    """The idle time of the rank that waits most: makespan minus its busy time."""
    return max(timeline.idle().values())


def memory_table(ranks: int, microbatches: int, rank_costs: Costs | None = None,
                 names: Sequence[str] = NAMES) -> list[dict]:
    """`compare.schedule_table` for the chapter's schedules (same model, costs per rank's worth
    of layers): bubble share, peak activations (units of a rank's worth of layers) and weights
    per rank (units of a rank's worth of the model; 2 with weight replicas)."""
    return schedule_table(ranks, microbatches, rank_costs, names=list(names))


def plot_memory_table(rows: list[dict], title: str = ""):
    """Three panels on one schedule axis: bubble, peak activations, weights per rank. Draws
    exactly `rows` (from `memory_table`)."""
    import matplotlib.pyplot as plt
    shown = [r for r in rows if not r.get("error")]
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 0.9 + 0.45 * len(shown)), sharey=True)   # ~960 px
    y = range(len(shown))
    panels = [("bubble (% of the makespan)", [100 * r["bubble"] for r in shown], "#8c8c8c"),
              ("peak activations, busiest rank\n(microbatches × a rank's layers)",
               [r["peak"] for r in shown], "#4c72b0"),
              ("weights per rank\n(× a rank's share of the model)",
               [r["weights"] for r in shown], "#dd8452")]
    for ax, (label, values, colour) in zip(axes, panels):
        ax.barh(list(y), values, color=colour)
        for k, v in enumerate(values):
            ax.text(v, k, f" {v:.3g}", va="center", fontsize=8)
        ax.set_xlabel(label, fontsize=9)
        ax.set_xlim(0, max(values, default=1) * 1.3 or 1)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(y), [r["name"] for r in shown])
    axes[0].invert_yaxis()
    fig.suptitle(title or "bubble, activation memory and weight memory — simulated", fontsize=10)
    fig.tight_layout()
    return fig


OVERLAP_LABEL = "overlap pairs (as a GPU would: max(F, B))"


def bidirectional_explorer(ranks: int = 4, microbatches: int = 8):
    """Sliders: schedule, p, m, F : I : W, message cost and "overlap pairs" (what a GPU would
    do with a compound F&B step); the schedule against 1F1B on the same model, simulated, with
    its worst rank's idle time next to DeepSeek's or Chimera's closed form. Where the switch
    cannot act (a refused setting, or Chimera, which has no pairs) its label says why."""
    import ipywidgets as w

    controls = {
        "name": ui.control(w.Dropdown, "schedule", options=["chimera", "dualpipe", "dualpipe-v"],
                           value="dualpipe"),
        "ranks": ui.slider("int", "ranks p", value=ranks, min=2, max=8, step=2),
        "microbatches": ui.slider("int", "microbatches m", value=microbatches, min=2, max=32,
                                  step=2),
        "F": slider(1.0, "forward F"), "I": slider(1.0, "input gradient I"),
        "W": slider(1.0, "weight gradient W"),
        "comm": slider(0.0, "message cost c", lo=0.0, hi=1.0, step=0.05),
        "overlap": ui.control(w.Checkbox, OVERLAP_LABEL, value=False, indent=True),
    }
    switch = controls["overlap"]

    def draw(name, ranks, microbatches, F, I, W, comm, overlap):  # noqa: E741
        costs = Costs(F=F, I=I, W=W, comm=comm, overlap=0.0 if overlap else None)
        drawn = against_1f1b(name, ranks, microbatches, costs, memory=True)
        if drawn is None:
            switch.description = "overlap pairs — no effect: this setting is refused"
            print("(the overlap switch has nothing to act on: no schedule was built for these "
                  "settings)")
            return
        switch.description = ("overlap pairs — no effect: Chimera has no F&B pairs"
                              if name == "chimera" else OVERLAP_LABEL)
        base, tl = drawn
        print(f"simulated: {name} makespan {tl.makespan:.4g} (1F1B {base.makespan:.4g}); "
              f"idle time of the worst rank {worst_idle(tl):.4g} (1F1B {worst_idle(base):.4g})"
              + (" — pairs overlapped, as on a GPU (a model, not a measurement)" if overlap
                 else " — pairs run one part after the other, as on a CPU"))
        if name == "chimera":
            print(f"simulated bubble {tl.bubble_fraction():.1%}; the slot counts: forward "
                  f"doubling (the default) (p−2)/(3m/2+p−2) = "
                  f"{chimera_doubling_bubble_fraction(ranks, microbatches):.1%} when I + W = 2F "
                  f"and m is a multiple of 2p; direct concatenation (p−2)/(2m+p−2) = "
                  f"{chimera_bubble_fraction(ranks, microbatches):.1%} when I + W = F "
                  f"(scaling='concat'); the basic unit (m = p) is both")
        else:
            stages = ranks if name == "dualpipe" else 2 * ranks
            share = ranks / stages        # a chunk's share of a rank's worth of layers
            print(f"DeepSeek's (PP/2−1)(F&B + B − 3W) with PP = {stages}: "
                  f"{dualpipe_bubble(stages, F * share, I * share, W * share, 0.0 if overlap else None):.4g}"
                  f" (chunk costs; exact when F = I ≥ W and comm = 0)")

    return ui.slider_box(controls, draw, min_height="900px")
