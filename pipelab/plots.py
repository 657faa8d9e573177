"""Pictures of timelines: Gantt charts and activation-memory curves, labelled with their source."""
from __future__ import annotations

from typing import Sequence

KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}
OTHER_COLOUR = "#8172B3"


def _axes(ax, figsize=(10, 3)):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _time_scale(timeline) -> tuple[float, str]:
    """Seconds are shown as ms; model cost units as they are."""
    return (1e3, "ms") if timeline.time_unit == "s" else (1.0, timeline.time_unit)


def plot_gantt(timeline, ax=None, title: str | None = None, xmax: float | None = None):
    """One row per rank (rank 0 on top); a box per action, coloured by kind, with its microbatch."""
    from matplotlib.patches import Patch
    ax = _axes(ax, figsize=(10, 0.5 + 0.45 * timeline.ranks))
    scale, unit = _time_scale(timeline)
    t0 = timeline.start
    span = (timeline.makespan or 1.0) * scale
    for e in timeline.events:
        left, width = (e.start - t0) * scale, e.duration * scale
        ax.barh(e.rank, width, left=left, height=0.8,
                color=KIND_COLOURS.get(e.action.kind, OTHER_COLOUR), edgecolor="white", linewidth=0.5)
        if width > span / 60 and timeline.ranks <= 16:
            chunk_mark = "'" * (e.action.stage // timeline.ranks) if _multi_stage(timeline) else ""
            ax.text(left + width / 2, e.rank, f"{e.action.microbatch}{chunk_mark}",
                    ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(timeline.ranks), [f"rank {r}" for r in range(timeline.ranks)])
    ax.set_ylim(timeline.ranks - 0.5, -0.5)
    ax.set_xlim(0, xmax if xmax is not None else span)
    ax.set_xlabel(f"time ({unit})")
    kinds = sorted({e.action.kind for e in timeline.events}, key="FBIW".find)
    ax.legend(handles=[Patch(color=KIND_COLOURS.get(k, OTHER_COLOUR), label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    heading = title or timeline.title or "pipeline"
    ax.set_title(f"{heading} — {timeline.source}: makespan {timeline.makespan * scale:.3g} {unit}, "
                 f"bubble {timeline.bubble_fraction():.1%} of the makespan", fontsize=10)
    return ax


def _multi_stage(timeline) -> bool:
    return any(e.action.stage >= timeline.ranks for e in timeline.events)


def plot_memory(timeline, ax=None, title: str | None = None):
    """Live activations per rank over time (a step curve per rank)."""
    ax = _axes(ax, figsize=(10, 3))
    scale, unit = _time_scale(timeline)
    t0 = timeline.start
    mem_scale, mem_unit = (2**20, "MiB") if timeline.memory_unit == "bytes" else (1.0, timeline.memory_unit)
    for rank in range(timeline.ranks):
        curve = timeline.memory_curve(rank)
        if curve:
            ts = [max(0.0, (t - t0) * scale) for t, _ in curve]
            ax.step(ts, [level / mem_scale for _, level in curve], where="post", label=f"rank {rank}")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel(f"live activations ({mem_unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    heading = title or timeline.title or "pipeline"
    ax.set_title(f"{heading} — {timeline.source} activation memory", fontsize=10)
    return ax


def compare(timelines: Sequence, titles: Sequence[str] | None = None, memory: bool = False):
    """Timelines stacked on one shared time axis, e.g. measured / replayed / simulated."""
    import matplotlib.pyplot as plt
    rows = len(timelines)
    heights = [0.6 + 0.45 * t.ranks for t in timelines]
    fig, axes = plt.subplots(rows, 1, figsize=(10, sum(heights) + 0.6 * rows), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    same_unit = len({t.time_unit for t in timelines}) == 1
    xmax = max(t.makespan * _time_scale(t)[0] for t in timelines) if same_unit else None
    for i, (tl, ax) in enumerate(zip(timelines, axes[:, 0])):
        plot = plot_memory if memory else plot_gantt
        kwargs = {} if memory else {"xmax": xmax}
        plot(tl, ax=ax, title=titles[i] if titles else None, **kwargs)
    fig.tight_layout()
    return fig


# --- stage balance (partitions) ---------------------------------------------------------------

BALANCE_COLOURS = {"params": "#8172B3", "flops": "#4C72B0", "times": "#DD8452"}
BALANCE_LABELS = {"params": "parameters", "flops": "FLOPs (model)", "times": "time (measured, one process)"}


def plot_balance(parts, ax=None, title: str | None = None):
    """Each stage's share of the model's parameters, FLOPs and (if measured) time, in percent.

    A dashed line marks the perfect share 100/stages: the pipeline runs at the pace of the tallest
    bar, so the height above the line is time every other stage spends waiting.
    """
    import numpy as np
    ax = _axes(ax, figsize=(max(5, 1.1 * parts.stages + 2), 3))
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
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"{parts.method}: {parts.layout}", fontsize=10)
    return ax


VOCAB_LAYER_COLOUR = "#C44E52"    # embedding and head: the layers that are unlike the blocks


def plot_layer_costs(cfg, batch_size: int = 1, layer_times=None, axes=None):
    """Per-layer parameters, forward FLOPs and (if given) measured time: embedding and head stand out."""
    import matplotlib.pyplot as plt
    from .model import layer_costs
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


def plot_sweep(name: str, ranks: Sequence[int], microbatches: Sequence[int], metric,
               ylabel: str, formula=None, ax=None, costs=None):
    """A simulated metric (a function of a Timeline) against microbatches, a line per depth p.

    `formula(p, m)`, when given, is drawn dashed so the simulated dots can be checked by eye.
    """
    from .schedules import schedule
    from .simulate import Costs, simulate
    ax = _axes(ax, figsize=(7, 3.5))
    for p in ranks:
        values = [metric(simulate(schedule(name, ranks=p, microbatches=m), costs or Costs()))
                  for m in microbatches]
        line, = ax.plot(microbatches, values, "o", markersize=4, label=f"p={p} simulated")
        if formula is not None:
            ax.plot(microbatches, [formula(p, m) for m in microbatches], "--",
                    color=line.get_color(), linewidth=1, label=f"p={p} formula")
    ax.set_xlabel("microbatches m")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{name}: simulated (dots)" + (" vs closed form (dashes)" if formula else ""),
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax
