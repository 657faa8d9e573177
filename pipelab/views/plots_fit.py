"""Fitting a picture to the room it has on screen: the figures' fixed margins, Gantt box labels
that shorten or disappear when their box is too narrow, and legends placed where they hide no
data. Measured in display units at draw time, so the answer holds at any figure size or dpi.
Re-exported by `pipelab.views.plots`."""
from __future__ import annotations

import functools

# Fixed margins (not tight_layout) so that every timeline figure of the same width puts its
# time axis at the same place: a Gantt chart and a memory plot drawn one under the other align.
MARGINS = dict(left=0.1, right=0.83)

# JupyterLab's output area is about 968 px wide (file browser open, 100% zoom): a wider picture
# is shrunk to fit, and its text with it (14's 1190-px chart showed 6-px labels). At the inline
# backend's 100 dpi, FIGURE_WIDTH inches fit; no text is drawn smaller than MIN_TEXT_PX.
NOTEBOOK_WIDTH_PX = 968
FIGURE_WIDTH = 9.6
MIN_TEXT_PX = 8.0


def figure_axes(ax, figsize=(FIGURE_WIDTH, 3)):
    """`ax`, or the axes of a new figure of `figsize` with the timeline figures' margins."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        fig.subplots_adjust(**MARGINS, bottom=0.5 / figsize[1], top=1 - 0.5 / figsize[1])
    return ax


@functools.cache
def fitted_label_class():
    """The Text subclass of a Gantt box's label (made on first use: importing pipelab does not
    import matplotlib)."""
    from matplotlib.text import Text

    class FittedLabel(Text):
        """A box's label that fits its box on screen: each time it is drawn, it measures its
        candidate texts (longest first) in display units against the box's drawn width and
        height, shows the first that fits with a little padding, and draws nothing when none
        does. Measured at draw time, so a figure resized, re-laid-out (`compare` adjusts its
        margins after drawing) or saved at another dpi still fits. `.shown` is the text drawn
        last (None when the box was too small for any)."""

        PAD = 1.0      # points of space kept on each side of the text
        SMALLER = 0.75   # the last try's font size, as a share of the chart's

        def __init__(self, x, y, candidates, box, **kwargs):
            super().__init__(x, y, candidates[0], **kwargs)
            self.candidates, self.box, self.shown = list(candidates), box, None
            self.base_size = self.get_fontsize()

        def draw(self, renderer):
            if renderer is None or not self.get_visible():
                return
            box = self.box
            (x0, y0), (x1, y1) = self.axes.transData.transform(
                [(box.get_x(), box.get_y()),
                 (box.get_x() + box.get_width(), box.get_y() + box.get_height())])
            room_w, room_h = abs(x1 - x0), abs(y1 - y0)
            pad = renderer.points_to_pixels(self.PAD)
            self.shown = None
            # The candidates at the chart's font size, then the shortest one a size smaller:
            # two-digit microbatches ("10") in narrow boxes stay readable instead of vanishing.
            tries = [(text, self.base_size) for text in self.candidates]
            floor = MIN_TEXT_PX * 72 / renderer.dpi        # never below 8 px on the page
            tries.append((self.candidates[-1], max(self.base_size * self.SMALLER, floor)))
            for text, size in tries:
                self.set_fontsize(size)
                width, height = self._size(text, renderer)
                if width + 2 * pad <= room_w and height <= room_h:
                    self.shown = text
                    break
            if self.shown is None:
                self.set_fontsize(self.base_size)
                return
            if self.get_text() != self.shown:
                self.set_text(self.shown)
            if box.get_hatch():
                # a halo in the box's own colour: the white hatching never runs through
                # the digits ("10" on a hatched chunk box read as a smudge)
                from matplotlib import patheffects
                self.set_path_effects([patheffects.withStroke(
                    linewidth=2.2, foreground=box.get_facecolor())])
            super().draw(renderer)

        _sizes: dict = {}      # (text, font, dpi) -> (width, height) in pixels: a chart
        #                        repeats a few short labels hundreds of times, on every frame

        def _size(self, text: str, renderer) -> tuple[float, float]:
            props = self.get_fontproperties()
            key = (text, hash(props), renderer.dpi)
            if key not in self._sizes:
                if len(self._sizes) > 10_000:       # many fonts or dpis: start over
                    self._sizes.clear()
                width, height, _ = renderer.get_text_width_height_descent(text, props,
                                                                           ismath=False)
                self._sizes[key] = (width, height)
            return self._sizes[key]

    return FittedLabel


def place_legend(ax, handles=None, where: str = "outside", **kwargs):
    """The shared legend placement. `where="outside"`: right of the axes, top-aligned, never over
    the data (the timeline figures' MARGINS leave room for it). `where="best"`: matplotlib's
    best spot inside the axes, then checked with `legend_covers`; a legend that still covers
    data moves outside. Returns the legend; `ax.pipelab_legend_where` says where it went."""
    if where not in ("outside", "best"):
        raise ValueError(f"where must be 'outside' or 'best', got {where!r}")
    options = dict(fontsize=8, frameon=False)
    options.update(kwargs)
    args = {} if handles is None else {"handles": handles}
    if where == "best":
        # inside the axes a frame keeps the text readable over grid lines
        shown = ax.legend(**args, loc="best", **{**options, "frameon": kwargs.get("frameon", True)})
        if not legend_covers(ax, shown):
            ax.pipelab_legend_where = "best"
            return shown
        shown.remove()
    ax.pipelab_legend_where = "outside"
    return ax.legend(**args, loc="upper left", bbox_to_anchor=(1.01, 1.0), **options)


def legend_covers(ax, shown=None, samples: int = 16) -> int:
    """How many pieces of data lie under the axes' legend on screen: points sampled along every
    line (`samples` per segment, steps drawn as steps), scatter points, and bars/boxes whose
    drawn extent meets the legend's box. 0 means the legend hides nothing."""
    import numpy as np
    from matplotlib.patches import Rectangle
    shown = shown if shown is not None else ax.get_legend()
    if shown is None:
        return 0
    # A draw settles what is lazy until then: autoscaled limits and the "best" location.
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    box = shown.get_window_extent(renderer)
    inside = 0
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if len(xy) == 0:
            continue
        if str(line.get_drawstyle()).startswith("steps") and len(xy) > 1:
            corners = np.column_stack([xy[1:, 0], xy[:-1, 1]])      # steps-post's corners
            xy = np.insert(xy, np.arange(1, len(xy)), corners, axis=0)
        if len(xy) > 1:
            t = np.linspace(0.0, 1.0, samples, endpoint=False)[None, :, None]
            xy = np.vstack([(xy[:-1, None, :] * (1 - t) + xy[1:, None, :] * t).reshape(-1, 2),
                            xy[-1:]])
        points = line.get_transform().transform(xy[np.isfinite(xy).all(axis=1)])
        inside += int(sum(box.contains(x, y) for x, y in points))
    for collection in ax.collections:
        points = collection.get_offset_transform().transform(collection.get_offsets())
        inside += int(sum(box.contains(x, y) for x, y in points))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and \
                box.overlaps(patch.get_window_extent(renderer)):
            inside += 1
    return inside
