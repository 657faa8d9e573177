"""Pictures and widgets of the planner (notebook 12): the Pareto plot and the explorer."""
from __future__ import annotations

from ..planner.plan import MiB, Plan, plan
from ..views import ui
from ..views.explorer import refusal

_MARKERS = "osD^v<>P*X"


def plot_frontier(p: Plan, ax=None, title: str | None = None):
    """Predicted step time against predicted peak memory per device for every candidate, one
    colour per schedule (hollow: does not fit), the budget as a line, the Pareto frontier as a
    staircase and the recommendation as a star. The time axis is logarithmic: the slowest
    candidates take tens of times the fastest, and a linear axis squashed the frontier into its
    bottom few percent; the legend sits outside the axes, never over a candidate."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7.4, 5.0))
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
    ax.set_ylabel("step time (ms, log scale)")
    ax.set_yscale("log")
    ax.set_title(title or f"{len(p)} candidates on {p.devices} devices — simulated (predicted)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    return ax


def w_share_by_flop_counter(cfg) -> float:
    """The weight-gradient share of one block's backward by torch's own FLOP counter: the
    backward's FLOPs with the weights requiring gradients, less those without (input gradient
    only), over the former. Independent of `flop_shares`' formula."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from ..model.gpt import ToyGPT
    block = ToyGPT(cfg).layers[1]

    def backward_flops(weights: bool) -> int:
        for param in block.parameters():
            param.requires_grad_(weights)
        x = torch.randn(1, cfg.seq_len, cfg.d_model, requires_grad=True)
        y = block(x)
        with FlopCounterMode(display=False) as counter:
            y.backward(torch.ones_like(y))
        return counter.get_total_flops()
    full = backward_flops(True)
    return (full - backward_flops(False)) / full


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
