"""The pictures of sim/compare.py: the schedule table's chart and the interactive explorers
(sliders in, simulated pictures out) of notebooks 04 and 05. They only draw what sim/compare.py's
data functions return. `pl.compare` is this module: it re-exports the simulator's comparisons
(`pipelab.sim.compare`) so that a notebook finds data and pictures under one name.
"""
from __future__ import annotations

from typing import Sequence

from ..sim.compare import *  # noqa: F401,F403  (pl.compare = the comparisons and their pictures)
from ..sim.compare import crossover_comm, interleaving_gain, longest_span, simulate_named
from ..sim.costs import Costs
from . import ui
from .explorer import refusal
from .plots import compare as compare_plot


def plot_schedule_table(rows: list[dict], ax=None, title: str | None = None):
    """Scatter of a `schedule_table`: bubble (share of the makespan) against peak activations,
    one dot per schedule in a colour and marker of its own, its name beside it in that colour
    (schedules that land on one point share a label). Only draws."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    shown = [r for r in rows if not r.get("error")]
    palette = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors
    markers = "osD^vP*Xh<>p"
    at: dict[tuple, list[int]] = {}
    for k, r in enumerate(shown):
        at.setdefault((r["peak"], round(100 * r["bubble"], 6)), []).append(k)
        ax.plot(r["peak"], 100 * r["bubble"], markers[k % len(markers)], markersize=8,
                color=palette[k % len(palette)], label=r["name"])
    for (peak, bubble), ks in at.items():
        for j, k in enumerate(ks):          # one name per line where dots coincide
            ax.annotate(shown[k]["name"], (peak, bubble), textcoords="offset points",
                        xytext=(7, 3 - 11 * j), fontsize=9, color=palette[k % len(palette)])
    ax.set_xlabel("peak activations, busiest rank (microbatches × a rank's layers)")
    ax.set_ylabel("bubble (% of the makespan)")
    ax.set_xlim(left=0, right=max((r["peak"] for r in shown), default=1) * 1.35)
    ax.set_ylim(bottom=-2, top=max((100 * r["bubble"] for r in shown), default=1) * 1.2 + 2)
    ax.grid(alpha=0.3)
    ax.set_title(title or "every registered schedule — simulated: bubble vs peak memory",
                 fontsize=10)
    return ax


# --- explorers (sliders in, simulated pictures out) ----------------------------------------------

def interleaving_explorer(ranks: int = 4, microbatches: int = 8, chunks: int = 2,
                          comm: float = 0.0):
    """Sliders for v, p, m and the communication cost (in units of a rank's forward): 1F1B and
    interleaved 1F1B simulated for the same model on one time axis, with the crossover."""
    import matplotlib.pyplot as plt
    controls = {
        "chunks": ui.slider("int", "chunks per rank v", value=chunks, min=1, max=4),
        "ranks": ui.slider("int", "ranks p", value=ranks, min=2, max=8),
        "microbatches": ui.slider("int", "microbatches m", value=microbatches, min=2, max=32),
        "comm": ui.slider("float", "message cost c (× rank's forward)", value=comm, min=0.0,
                          max=2.0, step=0.05),
    }

    def draw(chunks, ranks, microbatches, comm):
        costs = Costs(comm=comm)
        try:
            plain = simulate_named("1f1b", ranks, microbatches, costs)
            inter = simulate_named("interleaved-1f1b", ranks, microbatches, costs, chunks=chunks)
        except ValueError as error:
            print(refusal(error))
            return
        compare_plot([plain, inter], titles=["1F1B", f"interleaved 1F1B, v={chunks}"])
        plt.show()
        gain = interleaving_gain(ranks, microbatches, chunks, comm)
        print(f"simulated makespan: 1F1B {plain.makespan:.4g}, interleaved {inter.makespan:.4g} "
              f"({gain['saving'] / plain.makespan:+.1%} saved); messages per step "
              f"{gain['messages_1f1b']} -> {gain['messages_interleaved']}")
        if chunks > 1:
            cross = crossover_comm(ranks, microbatches, chunks)
            print("interleaving stops paying at c = "
                  + (f"{cross:.3g} × a rank's forward" if cross is not None else "> 4 (not found)"))

    return ui.slider_box(controls, draw)


ZB_NAMES = ("1f1b", "zb-h1", "zb-h2", "zb-v")


def cost_slider(value: float, description: str, lo: float = 0.25, hi: float = 3.0,
                step: float = 0.25):
    """A float slider for one entry of a cost table (F, I, W, a message's cost)."""
    return ui.slider("float", description, value=value, min=lo, max=hi, step=step)


def against_1f1b(name: str, ranks: int, microbatches: int, costs: Costs, memory: bool = False):
    """An explorer's picture: the schedule and 1F1B simulated for the same model and drawn
    one above the other; (1F1B's timeline, the schedule's), or None (one line printed) when
    the schedule refuses these settings."""
    import matplotlib.pyplot as plt
    try:
        base = simulate_named("1f1b", ranks, microbatches, costs)
        tl = simulate_named(name, ranks, microbatches, costs)
    except ValueError as error:
        print(refusal(error))
        return None
    compare_plot([base, tl], titles=["1F1B", name], memory=memory)
    plt.show()
    return base, tl


def zero_bubble_explorer(names: Sequence[str] = ZB_NAMES, ranks: int = 4, microbatches: int = 8):
    """Sliders for F : I : W and the communication cost: the chosen schedule against 1F1B,
    simulated for the same model (Gantt and memory), with the per-rank span and the wall-clock
    makespan both printed."""
    import ipywidgets as w
    slider = cost_slider

    controls = {
        "name": ui.control(w.Dropdown, "schedule", options=list(names),
                           value=names[1] if len(names) > 1 else names[0]),
        "ranks": ui.slider("int", "ranks p", value=ranks, min=2, max=8),
        "microbatches": ui.slider("int", "microbatches m", value=microbatches, min=1, max=32),
        "F": slider(1.0, "forward F"), "I": slider(1.0, "input gradient I"),
        "W": slider(1.0, "weight gradient W"),
        "comm": slider(0.0, "message cost c", lo=0.0, hi=1.0, step=0.05),
    }

    def draw(name, ranks, microbatches, F, I, W, comm):  # noqa: E741
        drawn = against_1f1b(name, ranks, microbatches, Costs(F=F, I=I, W=W, comm=comm))
        if drawn is None:
            return
        base, tl = drawn
        peaks = tl.peak_activations()
        print(f"simulated: {name} makespan {tl.makespan:.4g} (1F1B {base.makespan:.4g}); "
              f"longest per-rank span {longest_span(tl):.4g}; "
              f"peak activations {max(peaks.values()):.3g} (1F1B {max(base.peak_activations().values()):.3g})")

    return ui.slider_box(controls, draw)
