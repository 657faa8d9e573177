"""Stage balance pictures: each stage's share of the parameters, FLOPs and time (partitions),
and per-layer costs. Re-exported by `pipelab.views.plots`."""
from __future__ import annotations

from .plots_fit import FIGURE_WIDTH, figure_axes, place_legend
from ..model.gpt import layer_costs


BALANCE_COLOURS = {"params": "#8172B3", "flops": "#4C72B0", "times": "#DD8452"}
BALANCE_LABELS = {"params": "parameters", "flops": "FLOPs (model)", "times": "time (measured, one process)"}


def plot_balance(parts, ax=None, title: str | None = None):
    """Each stage's share of the model's parameters, FLOPs and (if measured) time, in percent.

    A dashed line marks the perfect share 100/stages: the pipeline runs at the pace of the tallest
    bar, so the height above the line is time every other stage spends waiting.
    """
    import numpy as np
    ax = figure_axes(ax, figsize=(max(5, 1.1 * parts.stages + 2), 3))
    metrics = [m for m in ("params", "flops", "times") if getattr(parts, m) is not None]
    width = 0.8 / len(metrics)
    x = np.arange(parts.stages)
    for k, metric in enumerate(metrics):
        values = np.asarray(getattr(parts, metric), dtype=float)
        ax.bar(x + (k - (len(metrics) - 1) / 2) * width, 100 * values / values.sum(), width,
               color=BALANCE_COLOURS[metric],
               label=f"{BALANCE_LABELS[metric]}, max/mean {parts.imbalance(metric):.2f}")
    ax.axhline(100 / parts.stages, color="black", linestyle="--", linewidth=1, label="perfect balance")
    stage_layouts = parts.layout.split("|")
    ax.set_xticks(x, [f"stage {s}\n{stage_layouts[s]}" for s in range(parts.stages)], fontsize=8)
    ax.set_ylabel("share of the model (%)")
    place_legend(ax)
    ax.set_title(title or f"{parts.method}: {parts.layout}", fontsize=10)
    return ax


def plot_partitions(parts, note: str = "", cols: int = 2, panel_size=None):
    """Several partitions' balance charts side by side on one y-scale: `parts` maps a label
    to a Partition; each panel is titled "label: layout  (note)". Returns the figure, as wide
    as the notebook (panel_size: (width, height) inches of a panel; default: the width shared)."""
    import matplotlib.pyplot as plt
    items = list(parts.items())
    if not items:
        raise ValueError("plot_partitions needs at least one partition")
    cols = min(cols, len(items))
    rows = -(-len(items) // cols)
    if panel_size is None:     # 14 in (1,400 px) was shrunk to 968 px: its text to 6-7 px
        panel_size = (FIGURE_WIDTH / cols, 3.25)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_size[0] * cols, panel_size[1] * rows),
                             sharey=True, squeeze=False)
    suffix = f"  ({note})" if note else ""
    for ax, (label, p) in zip(axes.flat, items):
        p.plot(ax=ax, title=f"{label}: {p.layout}{suffix}")
    for ax in axes.flat[len(items):]:
        ax.set_visible(False)
    for ax in axes[:, 1:].flat:
        ax.set_ylabel("")                        # one y-scale, labelled once per row
    fig.tight_layout()
    return fig


VOCAB_LAYER_COLOUR = "#C44E52"    # embedding and head: the layers that are unlike the blocks


def plot_layer_costs(cfg, batch_size: int = 1, layer_times=None, axes=None):
    """Per-layer parameters, forward FLOPs and (if given) measured time: embedding and head stand out."""
    import matplotlib.pyplot as plt
    costs = layer_costs(cfg, batch_size)
    panels = [("params", [c["params"] / 1e3 for c in costs], "parameters (thousands)"),
              ("flops", [c["flops"] / 1e6 for c in costs], f"forward MFLOP (model, batch {batch_size})")]
    if layer_times is not None:
        panels.append(("times", [t * 1e3 for t in layer_times], "fwd+bwd ms (measured, one process)"))
    if axes is None:
        _, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    names = ["E" if c["kind"] == "embedding" else "L" if c["kind"] == "head" else str(c["index"])
             for c in costs]
    for ax, (metric, values, label) in zip(axes, panels):
        colours = [BALANCE_COLOURS[metric] if c["kind"] == "block" else VOCAB_LAYER_COLOUR for c in costs]
        ax.bar(range(len(values)), values, color=colours)
        ax.set_xticks(range(len(values)), names, fontsize=8)
        ax.set_xlabel("layer (E embedding, 1..n blocks, L head + loss)", fontsize=8)
        ax.set_title(label, fontsize=10)
    axes[0].figure.tight_layout()
    return axes
