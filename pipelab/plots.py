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
