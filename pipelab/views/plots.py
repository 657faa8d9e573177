"""Pictures of timelines: Gantt charts and activation-memory curves, labelled with their source."""
from __future__ import annotations

from typing import Sequence

from ..schedules.kinds import KIND_SPECS, ROLES, side_lanes
from .plots_fit import (FIGURE_WIDTH, MARGINS, figure_axes as _axes, fitted_label_class,  # noqa: F401
                        legend_covers, place_legend)
from ..support.drawers import register_drawer

# Each kind's colour and label are its spec's (register_kind(..., colour=, label=)); a colour
# set here overrides the spec's, for one notebook's pictures.
KIND_COLOURS: dict[str, str] = {}
OTHER_COLOUR = "#8172B3"          # any kind added later (compound, collective, ...)
CHUNK_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "++")   # chunk 0 plain, as the papers draw it
PHASE_COLOURS = {"warm-up": "#FCEBB6", "steady": "#D9EFD3", "cool-down": "#D6E4F5"}
PATH_COLOUR = "#D62728"


def _time_scale(timeline) -> tuple[float, str]:
    """Seconds are shown as ms; model cost units as they are."""
    return (1e3, "ms") if timeline.time_unit == "s" else (1.0, timeline.time_unit)


def _with_source(heading: str, source: str) -> str:
    """'heading — simulated': every chart says where its numbers come from, once (a title that
    already names its source keeps it as it is)."""
    return heading if source in heading else f"{heading} — {source}"


def kind_colour(kind: str) -> str:
    """The colour of `kind` in charts: an override in KIND_COLOURS, else its spec's."""
    spec = KIND_SPECS.get(kind)
    return KIND_COLOURS.get(kind) or (spec and spec.colour) or OTHER_COLOUR


def kind_legend(kind: str) -> str:
    """A kind's legend entry: its letter and its spec's label ("F forward")."""
    spec = KIND_SPECS.get(kind)
    return f"{kind} {spec.label}" if spec is not None and spec.label else kind


def _legend_order(kind: str) -> tuple[int, str]:
    """Legend order: the kinds by role as ROLES lists them (forward first), then by letter."""
    spec = KIND_SPECS.get(kind)
    return (ROLES.index(spec.role) if spec is not None else len(ROLES), kind)


def chunk_of(timeline) -> dict[int, int]:
    """stage -> its chunk index on its rank (0 for the rank's first stage, 1 for the next...)."""
    stages: dict[int, set[int]] = {}
    if timeline.schedule is not None:
        for stage, rank in enumerate(timeline.schedule.placement):
            stages.setdefault(rank, set()).add(stage)
    else:
        for e in timeline.events:
            stages.setdefault(e.rank, set()).add(e.action.stage)
    return {stage: i for mine in stages.values() for i, stage in enumerate(sorted(mine))}


def label_candidates(parts, chunks: dict[int, int]) -> list[str]:
    """A box's label, longest first: every part's microbatch with its chunk marks ("3'/5''"),
    then without the marks ("3/5": the hatching still tells the chunk), then the first part's
    microbatch alone ("3"). A step without a microbatch is named by its action ("0U")."""
    numbered = [part for part in parts if part.microbatch >= 0]
    if not numbered:
        return [str(parts[0]) if len(parts) == 1 else "+".join(map(str, parts))]
    full = "/".join(f"{part.microbatch}{chr(39) * chunks.get(part.stage, 0)}" for part in numbered)
    plain = "/".join(str(part.microbatch) for part in numbered)
    return list(dict.fromkeys([full, plain, str(numbered[0].microbatch)]))


def _lane_rows(copies: bool) -> dict[str, tuple[float, float]]:
    """{lane: (offset from the rank's row centre, height)}: the compute box fills the row, the
    communication lane is a strip under it; a copy lane, where there is one, a strip above it
    (the compute box then gives it room, so no strip touches the next rank's)."""
    if not copies:
        return {"compute": (-0.4, 0.8), "comm": (0.41, 0.14)}
    return {"copy": (-0.47, 0.13), "compute": (-0.32, 0.72), "comm": (0.41, 0.13)}


def plot_gantt(timeline, ax=None, title: str | None = None, xmax: float | None = None,
               critical_path: bool = False, phases: bool = False, legend: bool = True):
    """One row per rank (rank 0 on top); a box per action, coloured by kind, with its microbatch.

    Where a rank holds several stages (chunks), chunk 1, 2... are hatched (and marked ' ''
    after the microbatch). `phases=True` shades each rank's warm-up / steady / cool-down;
    `critical_path=True` outlines the chain that sets the makespan and draws its messages.
    The boxes and their labels are kept in `ax.pipelab_bars` / `ax.pipelab_labels`
    (event -> artist) for the player.
    """
    from matplotlib.patches import Patch, Rectangle
    ax = _axes(ax, figsize=(FIGURE_WIDTH, 0.9 + 0.45 * timeline.ranks))
    scale, unit = _time_scale(timeline)
    t0 = timeline.start
    span = (timeline.makespan or 1.0) * scale
    chunks = chunk_of(timeline)
    multi = max(chunks.values(), default=0) > 0
    bars, labels = {}, {}
    beside = side_lanes()     # kinds beside the compute: a thin strip by the rank's row
    rows = _lane_rows(any(beside.get(e.action.parts[0].kind) == "copy"
                          for e in timeline.events))
    for e in timeline.events:
        left, width = (e.start - t0) * scale, e.duration * scale
        chunk = chunks.get(e.action.stage, 0)
        hatch = CHUNK_HATCHES[chunk % len(CHUNK_HATCHES)] if multi else ""
        parts = e.action.parts
        lane = beside.get(parts[0].kind)
        offset, height = rows[lane or "compute"]
        y = e.rank + offset
        patch = Rectangle((left, y), width, height, facecolor=kind_colour(parts[0].kind),
                          edgecolor="white", linewidth=0.5, hatch=hatch or None,
                          hatchcolor="white", zorder=2)
        patch.pipelab_path = False
        # A compound step (an overlapped pair) is one box split into its parts' colours; the
        # parts after the first are overlays the player dims along with the box.
        patch.pipelab_overlays = []
        for k, part in enumerate(parts[1:], start=1):
            share = width / len(parts)
            overlay = Rectangle((left + k * share, y), share, height,
                                facecolor=kind_colour(part.kind), edgecolor="white",
                                linewidth=0.5, zorder=2.5)
            overlay.pipelab_colour = overlay.get_facecolor()
            ax.add_patch(overlay)
            patch.pipelab_overlays.append(overlay)
        ax.add_patch(patch)
        bars[e] = patch
        # under ~1% of the axes no label fits at any figure size the workbook uses
        if width > span / 120 and timeline.ranks <= 16 and not lane:
            # A label measures itself against its box when drawn: shortened or left out
            # where the box is too narrow (interleaved, V and braided charts).
            label = fitted_label_class()(left + width / 2, e.rank,
                                         label_candidates(parts, chunks), patch,
                                         ha="center", va="center", fontsize=7, color="white",
                                         zorder=4, fontweight="bold" if multi else "normal")
            labels[e] = ax.add_artist(label)
            ax.add_artist(labels[e])
    ax.pipelab_bars, ax.pipelab_labels = bars, labels
    handles = [Patch(color=kind_colour(k),
                     label=f"{kind_legend(k)}\n({beside[k]} lane)" if k in beside
                     else kind_legend(k))
               for k in sorted({part.kind for e in timeline.events for part in e.action.parts},
                               key=_legend_order)]
    if multi:
        handles += [Patch(facecolor="#999999", edgecolor="white", hatchcolor="white",
                          hatch=CHUNK_HATCHES[c % len(CHUNK_HATCHES)] or None, label=f"chunk {c}")
                    for c in sorted(set(chunks.values()))]
    if phases:
        seen = set()
        for rank, spans in timeline.phases().items():
            for name, a, b in spans:
                ax.add_patch(Rectangle((a * scale, rank - 0.5), (b - a) * scale, 1.0,
                                       facecolor=PHASE_COLOURS[name], edgecolor="none", zorder=0))
                seen.add(name)
        handles += [Patch(color=PHASE_COLOURS[n], label=n) for n in PHASE_COLOURS if n in seen]
    note = ""
    if critical_path:
        path = timeline.critical_path()
        _draw_path(ax, timeline, path, bars, scale)
        handles.append(Patch(facecolor="none", edgecolor=PATH_COLOUR, linewidth=2,
                             label="critical path"))
        note = "\n" + path_summary(timeline, path)
    ax.set_yticks(range(timeline.ranks), [f"rank {r}" for r in range(timeline.ranks)])
    ax.set_ylim(timeline.ranks - (0.44 if any(e.action.parts[0].kind in beside
                                              for e in timeline.events) else 0.5), -0.5)
    ax.set_xlim(0, xmax if xmax is not None else span)
    ax.set_xlabel(f"time ({unit})")
    if legend:
        place_legend(ax, handles)
    heading = _with_source(title or timeline.title or "pipeline", timeline.source)
    ax.set_title(f"{heading}: makespan {timeline.makespan * scale:.4g} {unit}, "
                 f"bubble {timeline.bubble_fraction():.1%} of the makespan{note}", fontsize=10)
    return ax


def _draw_path(ax, timeline, path, bars, scale) -> None:
    t0 = timeline.start
    for i, step in enumerate(path):
        bar = bars.get(step.event)
        if bar is not None:
            bar.set_edgecolor(PATH_COLOUR)
            bar.set_linewidth(2.0)
            bar.set_zorder(3)
            bar.pipelab_path = True
        if i and step.edge == "data" and path[i - 1].event.rank != step.event.rank:
            before = path[i - 1].event
            ax.annotate("", xy=((step.event.start - t0) * scale, step.event.rank),
                        xytext=((before.end - t0) * scale, before.rank),
                        arrowprops=dict(arrowstyle="->", color=PATH_COLOUR, linewidth=1.2,
                                        shrinkA=0, shrinkB=0), zorder=5)


def path_summary(timeline, path=None) -> str:
    """"critical path: 22 actions = 33 compute + 8 comm + 0 waiting units; 16 rank crossings"
    (text of `Timeline.path_summary`)."""
    summary = timeline.path_summary(path)
    scale, unit = _time_scale(timeline)
    return (f"critical path: {summary.actions} actions = {summary.compute * scale:.4g} compute + "
            f"{summary.comm * scale:.4g} comm + {summary.waiting * scale:.4g} waiting {unit}; "
            f"{summary.crossings} rank crossings")


def _memory_scale(timeline) -> tuple[float, str]:
    """Bytes as MiB (KiB when the peak is under 1 MiB); other units as they are."""
    if timeline.memory_unit != "bytes":
        return 1.0, timeline.memory_unit
    peak = max(timeline.peak_activations().values(), default=0.0)
    return (2**20, "MiB") if peak >= 2**20 else (2**10, "KiB")


def plot_memory(timeline, ax=None, title: str | None = None, xmax: float | None = None,
                unit_bytes=None, ymax: float | None = None):
    """Live activations per rank over time (a step curve per rank), on the Gantt chart's time
    axis (0 to the makespan, or `xmax`).

    `unit_bytes` (bytes of one microbatch-stage of activations: one number, or {rank: bytes})
    gives each rank's peak in both units in the legend, e.g. "rank 0: peak 8.0 units = 36.1 MiB".
    """
    ax = _axes(ax, figsize=(FIGURE_WIDTH, 3))
    scale, unit = _time_scale(timeline)
    t0 = timeline.start
    span = (timeline.makespan or 1.0) * scale
    mem_scale, mem_unit = _memory_scale(timeline)
    end = xmax if xmax is not None else span
    # Ranks with the very same curve (DualPipe's and Chimera's mirrored ranks) would hide one
    # another: each later twin is drawn dashed and thinner on top, so the first shows through
    # its gaps, and the legend names its twin.
    twins: dict[tuple, list[int]] = {}
    for rank in range(timeline.ranks):
        twins.setdefault(tuple(timeline.memory_curve(rank)), []).append(rank)
    for rank in range(timeline.ranks):
        curve = timeline.memory_curve(rank)
        if not curve:
            continue
        group = twins[tuple(curve)]
        place = group.index(rank)
        ts = [max(0.0, (t - t0) * scale) for t, _ in curve] + [end]
        levels = [level / mem_scale for _, level in curve]
        label = _peak_label(timeline, rank, unit_bytes)
        ax.step(ts, levels + levels[-1:], where="post",
                linewidth=1.5 + (len(group) - 1 - place), zorder=2 + place,
                linestyle=(2 * place, (4, 4)) if place else "-",
                label=f"rank {rank}" + (f" = rank {group[0]}" if place else "")
                + (f" peak {label}" if label else ""))
    ax.set_xlim(0, end)
    ax.set_ylim(0, (ymax if ymax is not None else
                    max([lv / mem_scale for r in range(timeline.ranks)
                         for _, lv in timeline.memory_curve(r)] or [1.0])) * 1.15 or 1.0)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel(f"live activations\n({mem_unit})", fontsize=9)
    place_legend(ax)
    heading = _with_source(title or timeline.title or "pipeline", timeline.source)
    ax.set_title(f"{heading} activation memory", fontsize=10)
    return ax


def _peak_label(timeline, rank: int, unit_bytes) -> str:
    """The rank's peak in both units where the size of a unit is known, else ''."""
    if unit_bytes is None:
        return ""
    size = unit_bytes.get(rank) if isinstance(unit_bytes, dict) else unit_bytes
    if not size:
        return ""
    peak = timeline.peak_activations().get(rank, 0.0)
    if timeline.memory_unit == "bytes":
        units, nbytes = peak / size, peak
    else:
        units, nbytes = peak, peak * size
    return f"{units:.2g} units\n= {nbytes / 2**20:.3g} MiB"


def compare(timelines: Sequence, titles: Sequence[str] | None = None, memory: bool = False,
            share: str | bool = "auto", unit_bytes=None, critical_path: bool = False,
            phases: bool = False, panel_height: float | None = None, gantt: bool = True):
    """Timelines stacked in one figure, e.g. measured / replayed / simulated, or GPipe / 1F1B.

    `memory=True` puts each timeline's activation curves right under its Gantt chart
    (`gantt=False` leaves the Gantt charts out: memory panels only).
    `share="auto"`: one time axis (same limits) when every timeline has the same time unit,
    and one memory scale for the memory panels that have the same memory unit; True forces
    the time axis, False gives each panel its own. `unit_bytes` (one number or {rank: bytes})
    labels memory peaks in units and MiB. `panel_height` (inches) fixes every Gantt panel's
    height whatever the rank count (an explorer's output then keeps its height). Returns the figure.
    """
    import matplotlib.pyplot as plt
    rows = []
    for i, tl in enumerate(timelines):
        if gantt or not memory:
            rows.append(("gantt", i, panel_height or 0.9 + 0.45 * tl.ranks))
        if memory:
            rows.append(("memory", i, 2.0))
    heights = [h for _, _, h in rows]
    extra = 0.9 * len(rows) + (0.2 * len(timelines) if critical_path else 0.0)
    fig, axes = plt.subplots(len(rows), 1, figsize=(FIGURE_WIDTH, sum(heights) + extra + 0.3),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    same_unit = len({t.time_unit for t in timelines}) == 1
    share_x = same_unit if share == "auto" else bool(share)
    xmax = max(t.makespan * _time_scale(t)[0] for t in timelines) if share_x else None
    mem_max: dict[str, float] = {}
    if memory and share is not False:
        for tl in timelines:
            mem_scale, mem_unit = _memory_scale(tl)
            peak = max(tl.peak_activations().values(), default=0.0) / mem_scale
            mem_max[mem_unit] = max(mem_max.get(mem_unit, 0.0), peak)
    for (what, i, _), ax in zip(rows, axes[:, 0]):
        tl = timelines[i]
        title = titles[i] if titles else None
        if what == "gantt":
            plot_gantt(tl, ax=ax, title=title, xmax=xmax, critical_path=critical_path,
                       phases=phases)
        else:
            plot_memory(tl, ax=ax, title=title, xmax=xmax, unit_bytes=unit_bytes,
                        ymax=mem_max.get(_memory_scale(tl)[1]))
    height = fig.get_figheight()
    gaps = extra         # inches between panels: tick labels, axis label, a two-line title
    fig.subplots_adjust(**MARGINS, top=1 - (0.45 + 0.2 * critical_path) / height,
                        bottom=0.45 / height,
                        hspace=gaps / len(rows) / (sum(heights) / len(rows)))
    return fig


# Stage-balance charts and (p, m) sweeps live in their own modules; re-exported so that
# `plots.plot_balance`, `plots.sweep`... keep working.
from .plots_balance import (BALANCE_COLOURS, BALANCE_LABELS, VOCAB_LAYER_COLOUR, plot_balance,
                            plot_layer_costs, plot_partitions)
from .plots_sweep import SweepTable, plot_sweep, sweep  # noqa: E402,F401

# What `Timeline.plot()`, `Timeline.plot_memory()` and `Partition.plot()` draw (the simulator's
# floor asks by name, support/drawers.py, so it never imports this floor).
register_drawer("gantt", plot_gantt)
register_drawer("memory", plot_memory)
register_drawer("balance", plot_balance)
