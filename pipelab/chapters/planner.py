"""Pictures and widgets of the planner (notebook 12): the Pareto plot and the explorer."""
from __future__ import annotations

from ..planner.plan import MiB, Plan, plan
from ..views import ui
from ..views.explorer import refusal

_MARKERS = "osD^v<>P*X"


def plot_frontier(p: Plan, ax=None, title: str | None = None):
    """Predicted step time against predicted peak memory per device for every candidate, one
    colour per schedule (hollow: does not fit), the budget as a line, the Pareto frontier as a
    staircase and the recommendation as a star."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 5.2))
    names = sorted({c.schedule for c in p})
    colours = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        for fits in (True, False):
            mine = [c for c in p if c.schedule == name and c.fits == fits]
            if mine:
                ax.scatter([c.peak_memory / MiB for c in mine], [c.step_time * 1e3 for c in mine],
                           s=22, marker=_MARKERS[i % len(_MARKERS)], alpha=0.75,
                           facecolors=colours(i) if fits else "none", edgecolors=colours(i),
                           label=name if fits or not any(c.fits for c in p if c.schedule == name)
                           else None)
    front = p.frontier()
    ax.step([c.peak_memory / MiB for c in front], [c.step_time * 1e3 for c in front],
            where="post", color="black", lw=1, label="Pareto frontier")
    ax.axvline(p.budget / MiB, color="crimson", ls="--", lw=1,
               label=f"budget {p.budget / MiB:.0f} MiB")
    if p.fitting:
        best = p.best
        ax.scatter([best.peak_memory / MiB], [best.step_time * 1e3], marker="*", s=260,
                   color="gold", edgecolors="black", zorder=5, label="recommended")
    ax.set_xlabel("peak memory per device (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title or f"{len(p)} candidates on {p.devices} devices — simulated (predicted)")
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    ax.grid(alpha=0.3)
    return ax


def planner_explorer(calibrate_model, *, devices: int = 4, budget_mib: float = 16.0,
                     layers: int = 8, batch_size: int = 32):
    """Sliders for devices, the memory budget and the model size (its number of blocks):
    the plan's Pareto plot and its one-sentence choice, redrawn. `calibrate_model(n_layers)`
    returns the Calibration of that model size (cache it: calibrating takes a second)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    controls = {
        "devices": ui.slider("int", "devices", value=devices, min=1, max=16),
        "budget": ui.slider("float", "memory per device (MiB)", value=budget_mib, min=1.0,
                            max=64.0, step=1.0),
        "layers": ui.control(w.Dropdown, "model size (blocks)", options=[2, 4, 8, 16],
                             value=layers),
    }

    def draw(devices: int, budget: float, layers: int) -> None:
        try:
            p = plan(calibrate_model(layers).cfg, devices=devices,
                     memory_per_device=int(budget * MiB), batch_size=batch_size,
                     calibration=calibrate_model(layers))
        except ValueError as error:
            print(refusal(error))
            return
        plot_frontier(p)
        plt.show()
        print(p.explain())

    return ui.slider_box(controls, draw)
