"""Play a pipeline back: at time t, what every rank runs, which messages fly, what memory is live.

The questions are pure functions of a Timeline (`running_at`, `messages_in_flight`,
`live_activations`, `status`), tested without a browser. `player()` draws the Gantt chart(s)
and memory curves once, on one time axis, and on each frame only moves the cursor, re-dims the
boxes and redraws the arrows, then sends one PNG of fixed size (the page never jumps).

It renders at the size it is shown (DISPLAY_WIDTH pixels: no stretching, no blur). A frame that
lights the same boxes and arrows as the one before only moves the cursors: they are drawn over
the saved picture of the rest (blitting), a fraction of a full redraw. Play goes through any
timeline in about PLAY_SECONDS, stepping over frames when there are many, and redraws are
throttled so that the chart keeps up with a dragged slider (the newest position wins).
"""
from __future__ import annotations

import io
import math
import time
from bisect import bisect_right
from typing import NamedTuple, Sequence

from ..schedules.kinds import ACTIVATION, KIND_SPECS
from ..sim.timeline import Event, Timeline
from ..sim.costs import Costs
from ..sim.simulate import simulate
from . import plots, ui


class Message(NamedTuple):
    """An output crossing ranks: sent when `producer` ended, received when `consumer` starts;
    `what` travels ("activation" or "gradient")."""
    producer: Event
    consumer: Event
    what: str


# --- what happens at time t (t is measured from the timeline's start) -----------------------

def running_at(tl: Timeline, t: float) -> dict[int, Event | None]:
    """The event each rank runs at t (start <= t < end), or None when the rank is idle."""
    index = _index(tl)
    out = {}
    for rank in range(tl.ranks):
        starts, events = index["starts"][rank], index["events"][rank]
        i = bisect_right(starts, t + tl.start) - 1
        out[rank] = events[i] if i >= 0 and events[i].end > t + tl.start else None
    return out


def messages_in_flight(tl: Timeline, t: float) -> list[Message]:
    """Transfers between ranks whose send has happened (producer ended at or before t) and
    whose receive has not (the consumer starts after t)."""
    now = t + tl.start
    return [m for m in _index(tl)["messages"] if m.producer.end <= now < m.consumer.start]


def flight_note(flying: Sequence[Message], t: float) -> str:
    """"3 message(s) in flight", saying why where it would puzzle: messages from passes that
    cost nothing (a simulation's free vocabulary passes) are sent the instant they start, at
    t = 0 too, before any rank has run; sent messages wait until their receiver gets to them."""
    if not flying:
        return "no message in flight"
    free = [m for m in flying if m.producer.end <= m.producer.start]
    note = f"{len(flying)} message(s) in flight"
    if free:
        names = ", ".join(sorted({str(m.producer.action) for m in free})[:3])
        note += (f" ({len(free)} sent by passes that cost nothing here ({names}"
                 f"{', …' if len(free) > 3 else ''}), sent as they start, "
                 f"{'at t = 0, ' if t <= 0 else ''}waiting for their receivers)")
    return note


# A deep queue (a fast rank sending to a slow one) puts dozens of messages in flight on one
# link at once: drawn, they fan out into a black wedge over the boxes. The player draws the ones
# to be received next on each link and says how many more wait behind them.
ARROWS_PER_LINK = 3


def arrows_to_draw(flying: Sequence[Message], per_link: int = ARROWS_PER_LINK
                   ) -> tuple[list[Message], list[tuple[Message, int]]]:
    """(the messages drawn as arrows, [(the last one drawn on a link, how many more wait on
    it)]): on each link (sending rank, receiving rank), the `per_link` received first."""
    links: dict[tuple[int, int], list[Message]] = {}
    for m in flying:
        links.setdefault((m.producer.rank, m.consumer.rank), []).append(m)
    drawn, more = [], []
    for queue in links.values():
        queue.sort(key=lambda m: (m.consumer.start, m.producer.end))
        drawn += queue[:per_link]
        if len(queue) > per_link:
            more.append((queue[per_link - 1], len(queue) - per_link))
    return drawn, more


def live_activations(tl: Timeline, t: float) -> dict[int, float]:
    """Each rank's live activations at t (in `tl.memory_unit`), read off its step curve."""
    now, out = t + tl.start, {}
    for rank in range(tl.ranks):
        level = 0.0
        for when, value in tl.memory_curve(rank):
            if when > now:
                break
            level = value
        out[rank] = level
    return out


def status(tl: Timeline, t: float) -> list[str]:
    """One line per rank: "rank 0 runs 0F3", "rank 1 idle (waiting for 0F3's activation)"..."""
    running = running_at(tl, t)
    live = live_activations(tl, t)
    comm = tl.comm or 0.0
    now = t + tl.start
    index = _index(tl)
    lines = []
    for rank in range(tl.ranks):
        event = running[rank]
        if event is not None:
            doing = f"runs {event.action}"
        else:
            starts, events = index["starts"][rank], index["events"][rank]
            i = bisect_right(starts, now)
            doing = "idle (done)" if i >= len(events) else f"idle ({_why_waiting(tl, events[i], now, comm)})"
        lines.append(f"rank {rank} {doing}; live activations {_amount(live[rank], tl.memory_unit)}")
    return lines


def _amount(level: float, unit: str) -> str:
    if unit == "bytes":
        return f"{level / 2**20:.3g} MiB" if level >= 2**20 else f"{level / 2**10:.3g} KiB"
    return f"{level:.4g}"


def _why_waiting(tl: Timeline, next_event: Event, now: float, comm: float) -> str:
    pending = []
    for dep in tl.dependencies_of(next_event):
        arrival = dep.end + (comm if dep.rank != next_event.rank else 0.0)
        if arrival > now:
            pending.append((arrival, dep))
    if not pending:      # measured runs: the inputs are here, the rank is still getting to it
        return f"its inputs have arrived; next: {next_event.action}"
    _, dep = max(pending, key=lambda p: (p[0], p[1].rank))
    what = _carried(tl, dep, next_event)
    where = "in flight" if dep.end <= now else f"rank {dep.rank} still computing it" \
        if dep.rank != next_event.rank else "computed here first"
    return f"waiting for {dep.action}'s {what}, {where}; next: {next_event.action}"


def _carried(tl: Timeline, producer: Event, consumer: Event) -> str:
    """What `consumer` reads from `producer`: "activation" if the part it reads produces
    activations (its kind spec says so), else "gradient". Read per part: a compound step
    (`0F1+0B0`) sends both."""
    schedule, made = tl.dependency_schedule(), set(producer.action.parts)
    for part in consumer.action.parts:
        for edge in schedule.inputs(part):
            if edge[1] in made:
                return "activation" if KIND_SPECS[edge[1].kind].output == ACTIVATION else "gradient"
    return "gradient"


def _index(tl: Timeline) -> dict:
    """Per-rank start times and events, and every cross-rank message; cached on the timeline."""
    cached = getattr(tl, "_player_index", None)
    if cached is not None and cached[0] is tl.events:
        return cached[1]
    per_rank = [tl.events_of(r) for r in range(tl.ranks)]
    messages = [Message(dep, e, _carried(tl, dep, e)) for e in tl.events for dep in tl.dependencies_of(e)
                if dep.rank != e.rank]
    index = {"events": per_rank, "starts": [[e.start for e in mine] for mine in per_rank],
             "messages": messages}
    tl._player_index = (tl.events, index)
    return index


# Frames a play-through shows one by one (PLAY_SECONDS / MIN_INTERVAL): with more, Play had
# to step over frames and start after t = 0 (and 399-frame sliders moved a hair per key press).
MAX_FRAMES = 121


def frame_times(timelines: Sequence[Timeline], limit: int = MAX_FRAMES) -> list[float]:
    """The instants worth showing: every start and end, and the middle between two of them,
    on the first timeline's clock (at most `limit`, evenly thinned)."""
    points = {0.0}
    for tl, factor in zip(timelines, _clock_factors(timelines)):
        for e in tl.events:
            points.add((e.start - tl.start) / factor)
            points.add((e.end - tl.start) / factor)
    ordered = sorted(points)
    frames = sorted(set(ordered) | {(a + b) / 2 for a, b in zip(ordered, ordered[1:])})
    if len(frames) > limit:
        step = (len(frames) - 1) / (limit - 1)
        frames = [frames[round(i * step)] for i in range(limit)]
    return frames


DISPLAY_WIDTH = 968        # pixels: the chart's width on the page (10 inches at 96.8 dpi)
PLAY_SECONDS = 15.0        # a play-through takes about this long, whatever the timeline's length
MIN_INTERVAL = 0.12        # seconds between played frames: what a redraw costs, with room
MAX_INTERVAL = 0.35


def playback(frames: int, seconds: float = PLAY_SECONDS) -> tuple[int, int, int]:
    """(first frame, step, interval in ms) of the play button for `frames` frames: a frame every
    `seconds / frames` s within [MIN_INTERVAL, MAX_INTERVAL], and every `step`-th frame where
    there are too many to show at MIN_INTERVAL; the first frame is chosen so that the steps land
    on the last one."""
    moves = max(frames - 1, 1)
    step = max(1, math.ceil(moves * MIN_INTERVAL / seconds))
    interval = min(max(seconds / max(moves // step, 1), MIN_INTERVAL), MAX_INTERVAL)
    return moves % step if frames > 1 else 0, step, round(interval * 1000)


def _clock_factors(timelines: Sequence[Timeline]) -> list[float]:
    """1 for timelines on the first one's time unit; otherwise the ratio of makespans, so that
    timelines in other units are shown at the same share of their makespan."""
    first = timelines[0]
    return [1.0 if tl.time_unit == first.time_unit or not first.makespan
            else (tl.makespan or 1.0) / first.makespan for tl in timelines]


# --- the widget ---------------------------------------------------------------------------------

def _as_timelines(timelines) -> list[Timeline]:
    items = timelines if isinstance(timelines, (list, tuple)) else [timelines]
    out = []
    for item in items:
        if isinstance(item, Timeline):
            out.append(item)
        elif hasattr(item, "execution_order"):
            out.append(simulate(item, Costs()))
        else:
            raise ValueError(f"player() takes Timelines or Schedules, got {type(item).__name__}")
    if not out:
        raise ValueError("player() needs at least one timeline")
    return out


def player(timelines, *, memory: bool = True, phases: bool = True, critical_path: bool = False,
           messages: bool = True, title: str | None = None,
           titles: Sequence[str | None] | None = None):
    """A play button and a time slider over one or several timelines (e.g. measured, replayed,
    simulated), drawn on one time axis. At time t: the running boxes bright and outlined, the
    rest dimmed; arrows for messages in flight (on each link the next ARROWS_PER_LINK, and how
    many more are queued); a cursor on the memory curves with each rank's
    live activations; below, one line per rank saying what it does or waits for.

    `timelines`: a Timeline, a list of them, or a Schedule (simulated with unit costs).
    `titles`: one heading per timeline (None keeps that timeline's own `.title`); `title` labels
    the first panel only (kept for one-timeline calls). The timelines themselves are not changed.
    Returns the widget (a VBox; also usable as a cell's last expression). `.show(t)` jumps.
    """
    import ipywidgets as w
    timelines = _as_timelines(timelines)
    box = w.VBox()
    _setup(box, timelines, memory=memory, phases=phases, critical_path=critical_path,
           messages=messages, headings=headings(timelines, title, titles))
    return box


def headings(timelines: Sequence[Timeline], title: str | None = None,
             titles: Sequence[str | None] | None = None) -> list[str | None]:
    """The heading of each timeline's panels: `titles[i]` if given, else `title` for the first
    panel, else the timeline's own `.title`."""
    if titles is not None:
        if title is not None:
            raise ValueError("give `title` or `titles`, not both")
        if isinstance(titles, str) or len(titles) != len(timelines):
            raise ValueError(f"titles: give one per timeline ({len(timelines)}), got "
                             f"{1 if isinstance(titles, str) else len(titles)}")
        return [t if t is not None else (tl.title or None) for t, tl in zip(titles, timelines)]
    return [title if (title and i == 0) else (tl.title or None) for i, tl in enumerate(timelines)]


def _setup(box, timelines, *, memory, phases, critical_path, messages, headings) -> None:
    import ipywidgets as w
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    box.timelines = timelines
    box.headings = headings
    box.factors = _clock_factors(timelines)
    box.frames = frame_times(timelines)
    scale, unit = plots._time_scale(timelines[0])
    box.unit = unit
    rows = []
    for i, tl in enumerate(timelines):
        rows.append(("gantt", i, 0.9 + 0.42 * tl.ranks))
        if memory:
            rows.append(("memory", i, 1.6))
    heights = [h for _, _, h in rows]
    extra = 0.9 * len(rows) + (0.2 * len(timelines) if critical_path else 0.0)
    fig = Figure(figsize=(10, sum(heights) + extra + 0.3), dpi=DISPLAY_WIDTH / 10)
    FigureCanvasAgg(fig)          # an offscreen canvas of its own: blitting needs its renderer
    axes = fig.subplots(len(rows), 1, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    # the longest timeline, in the first one's clock (a factor maps it to each timeline's own)
    xmax = max(tl.makespan / f for tl, f in zip(timelines, box.factors))
    box.gantt_axes, box.memory_axes, box.cursors = {}, {}, []
    mem_max: dict[str, float] = {}
    for tl in timelines:
        mem_scale, mem_unit = plots._memory_scale(tl)
        peak = max(tl.peak_activations().values(), default=0.0) / mem_scale
        mem_max[mem_unit] = max(mem_max.get(mem_unit, 0.0), peak)
    for (what, i, _), ax in zip(rows, axes):
        tl = timelines[i]
        heading = headings[i]
        if what == "gantt":
            plots.plot_gantt(tl, ax=ax, title=heading, critical_path=critical_path,
                             phases=phases)
            box.gantt_axes[i] = ax
        else:
            plots.plot_memory(tl, ax=ax, title=heading, ymax=mem_max.get(plots._memory_scale(tl)[1]))
            box.memory_axes[i] = ax
        # A timeline in another unit is stretched onto the first one's axis.
        ax.set_xlim(0, xmax * box.factors[i] * plots._time_scale(tl)[0])
        box.cursors.append((i, ax.axvline(0, color="black", linewidth=1.2, zorder=6)))
    height = fig.get_figheight()
    fig.subplots_adjust(**plots.MARGINS, top=1 - (0.45 + 0.2 * critical_path) / height,
                        bottom=0.45 / height,
                        hspace=extra / len(rows) / (sum(heights) / len(rows)))
    box.figure = fig
    box.messages = messages
    box.arrows = []
    box.markers = {i: ax.scatter([], [], s=18, color="black", zorder=7)
                   for i, ax in box.memory_axes.items()}
    box.highlighted = [set() for _ in timelines]
    box.colours = [{e: bar.get_facecolor() for e, bar in ax.pipelab_bars.items()}
                   for _, ax in sorted(box.gantt_axes.items())]

    _, step, interval = playback(len(box.frames))
    # min 0: jslinked to the slider, a Play whose min was above 0 pulled the slider off t = 0
    box.play = w.Play(value=0, min=0, max=len(box.frames) - 1, step=step, interval=interval,
                      description="play", layout=w.Layout(width="120px"))
    box.base_interval = interval
    # Beside the play button the label is short, so the track gets the width.
    box.slider = w.IntSlider(value=0, min=0, max=len(box.frames) - 1, description="time",
                             readout=False, continuous_update=True,
                             style={"description_width": "50px"}, layout=ui.layout())
    box.time_label = w.HTML(layout=w.Layout(width="180px"))
    w.jslink((box.play, "value"), (box.slider, "value"))
    box.image = w.Image(format="png", layout=w.Layout(width=f"{DISPLAY_WIDTH}px", max_width="100%",
                                                      height="auto"))
    lines = 1 + sum(1 + tl.ranks for tl in timelines)
    box.status = w.HTML(layout=w.Layout(min_height=f"{20 * lines + 10}px"))
    for widget, name in ((box, "player"), (box.play, "player-play"), (box.slider, "player-time"),
                         (box.image, "player-chart"), (box.status, "player-status")):
        widget.add_class(f"pipelab-{name}")

    def show(t: float) -> None:
        _draw_frame(box, t)

    box.drawn_key, box.full_draws = None, 0     # what the saved background shows; redraws
    box.throttle = Throttle(lambda: show(box.frames[box.slider.value]))

    def on_frame(_change) -> None:
        box.throttle.request()
        if box.play.playing:
            _pace(box)

    def on_playing(change) -> None:
        if not change["new"]:          # Pause: drop what is queued, show where the slider is now
            box.throttle.flush()
            box.play.interval = box.base_interval

    box.show = show
    box.slider.observe(on_frame, names="value")
    box.play.observe(on_playing, names="playing")
    box.children = [w.HBox([box.play, box.slider, box.time_label]), box.image, box.status]
    show(box.frames[0])


class Throttle:
    """Calls `draw` (which draws the newest state) at most once per `gap` seconds after the last
    draw ended: a request sooner than that is deferred on the kernel's event loop, and requests
    that pile up meanwhile are answered by that one deferred draw (a dragged slider or a fast
    play button sends more positions than a redraw can keep up with; the newest wins). Without
    a running event loop (a script, a test) every request draws at once."""

    def __init__(self, draw, gap: float = 0.05):
        self.draw, self.gap = draw, gap
        self.pending = None
        self.last_end = float("-inf")
        self.cost = 0.0                 # seconds the last draw took

    def flush(self) -> None:
        """Cancel a deferred draw and draw the newest state now."""
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        self._run()

    def request(self) -> None:
        import asyncio
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._run()
        elif self.pending is None:
            wait = self.last_end + self.gap - time.perf_counter()
            if wait <= 0:
                self._run()
            else:
                self.pending = loop.call_later(wait, self._deferred)

    def _deferred(self) -> None:
        self.pending = None
        self._run()

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            self.draw()
        finally:
            self.last_end = time.perf_counter()
            self.cost = self.last_end - began


def _pace(box) -> None:
    """While playing, space the Play button's frames by what a draw costs here (with room): the
    front end never runs ahead of the kernel, so Pause stops the picture at once instead of
    after a queue of frames (0.4–3.7 s at load 8–20)."""
    wanted = max(box.base_interval, min(round(1500 * box.throttle.cost), 3000))
    if abs(wanted - box.play.interval) > 0.2 * box.play.interval:
        box.play.interval = wanted


def _draw_frame(box, t: float) -> None:
    """Show time t (first timeline's clock): re-dim the boxes and redraw the arrows when what is
    lit or in flight changed since the last frame, then draw the cursors and markers over."""
    import html

    text = [f"<b>t = {t * plots._time_scale(box.timelines[0])[0]:.4g} {box.unit}</b>"]
    state = []
    for i, tl in enumerate(box.timelines):
        local = t * box.factors[i]
        running = running_at(tl, local)
        flying = messages_in_flight(tl, local)
        lit = {e for e in running.values() if e is not None}
        state.append((lit, flying))
        box.highlighted[i] = lit
        if i in box.memory_axes:
            scale, mem_scale = plots._time_scale(tl)[0], plots._memory_scale(tl)[0]
            live = live_activations(tl, local)
            box.markers[i].set_offsets([(local * scale, live[r] / mem_scale)
                                        for r in range(tl.ranks)])
        heading = box.headings[i] or "pipeline"
        name = html.escape(heading if tl.source in heading else f"{heading} ({tl.source})")
        text.append(f"<b>{name}</b>: {flight_note(flying, local)}")
        text += [html.escape(line) for line in status(tl, local)]
    for i, cursor in box.cursors:
        scale = plots._time_scale(box.timelines[i])[0]
        cursor.set_xdata([t * box.factors[i] * scale] * 2)
    key = [(frozenset(lit), tuple(flying)) for lit, flying in state]
    if key != box.drawn_key:            # other boxes lit or arrows flying: a full redraw
        _draw_background(box, t, state)
        box.drawn_key = key
        box.full_draws += 1
    box.image.value = _blit(box)
    box.time_label.value = text[0]
    box.status.value = ("<div style='font-family: monospace; font-size: 12px; "
                        "line-height: 20px; white-space: pre'>" + "<br>".join(text) + "</div>")


def _moving(box) -> list:
    """The artists that move every frame: the cursors and the memory markers."""
    return [c for _, c in box.cursors] + list(box.markers.values())


def _draw_background(box, t: float, state) -> None:
    """Re-dim the boxes, redraw the arrows and render everything but the moving artists; keep
    that picture for blitting."""
    from matplotlib.patches import FancyArrowPatch

    for arrow in box.arrows:
        arrow.remove()
    box.arrows = []
    for i, (tl, (lit, flying)) in enumerate(zip(box.timelines, state)):
        now = t * box.factors[i] + tl.start
        scale = plots._time_scale(tl)[0]
        ax = box.gantt_axes[i]
        for event, label in ax.pipelab_labels.items():
            label.set_color("white" if event in lit else "#444444")
        for event, bar in ax.pipelab_bars.items():
            on_path = getattr(bar, "pipelab_path", False)
            colour = box.colours[i][event]
            overlays = getattr(bar, "pipelab_overlays", ())    # a compound step's other parts
            if event in lit:
                bar.set_facecolor(colour)
                bar.set_edgecolor(plots.PATH_COLOUR if on_path else "black")
                bar.set_linewidth(2.5)
                for overlay in overlays:
                    overlay.set_facecolor(overlay.pipelab_colour)
            else:
                # Dimmed towards white, still opaque: over the phase shading, a transparent
                # box would turn muddy. Done boxes stay stronger than those still to come.
                fade = 0.45 if event.end <= now else 0.72
                bar.set_facecolor(_towards_white(colour, fade))
                bar.set_edgecolor(plots.PATH_COLOUR if on_path else "white")
                bar.set_linewidth(2.0 if on_path else 0.5)
                for overlay in overlays:
                    overlay.set_facecolor(_towards_white(overlay.pipelab_colour, fade))
        if box.messages:
            drawn, more = arrows_to_draw(flying)
            for m in drawn:
                arrow = FancyArrowPatch(((m.producer.end - tl.start) * scale, m.producer.rank),
                                        ((m.consumer.start - tl.start) * scale, m.consumer.rank),
                                        arrowstyle="-|>", mutation_scale=10, linewidth=1.3,
                                        color="black", zorder=8)
                ax.add_patch(arrow)
                box.arrows.append(arrow)
            for last, count in more:
                # by the head of the last arrow drawn on the link, on the side it comes from
                # (links into one rank from above and below keep apart)
                x = (last.consumer.start - tl.start) * scale
                side = 1 if last.producer.rank < last.consumer.rank else -1
                y = last.consumer.rank - 0.3 * side
                note = ax.text(x, y, f"+{count} more queued", fontsize=8, ha="right",
                               va="center", zorder=9,
                               bbox=dict(boxstyle="round,pad=0.2", facecolor="white",
                                         edgecolor="black", linewidth=0.6))
                box.arrows.append(note)
    moving = _moving(box)
    for artist in moving:
        artist.set_visible(False)
    canvas = box.figure.canvas
    canvas.draw()
    box.background = canvas.copy_from_bbox(box.figure.bbox)
    for artist in moving:
        artist.set_visible(True)


def _blit(box) -> bytes:
    """The saved background with the cursors and markers drawn over, as PNG bytes."""
    from PIL import Image

    canvas = box.figure.canvas
    canvas.restore_region(box.background)
    for artist in _moving(box):
        artist.axes.draw_artist(artist)
    width, height = canvas.get_width_height(physical=True)
    picture = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    buffer = io.BytesIO()
    picture.save(buffer, format="png", compress_level=1)     # fast: a frame, not an archive
    return buffer.getvalue()


def _towards_white(rgba, share: float) -> tuple:
    r, g, b = rgba[:3]
    return (r + (1 - r) * share, g + (1 - g) * share, b + (1 - b) * share, 1.0)
