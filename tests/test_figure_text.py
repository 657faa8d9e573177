"""Every picture the library draws is readable at the notebook's width: rendered as the inline
backend does (100 dpi, bbox_inches="tight"), shrunk as JupyterLab shrinks a picture wider than its
output area (NOTEBOOK_WIDTH_PX), no text drawn is smaller than MIN_TEXT_PX."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.views import plots, widgets  # noqa: E402
from pipelab.views.compare import plot_schedule_table, schedule_table  # noqa: E402
from pipelab.views.memory_bubble import memory_bubble_table, plot_memory_bubble  # noqa: E402
from pipelab.views.plots_fit import MIN_TEXT_PX, NOTEBOOK_WIDTH_PX  # noqa: E402

DPI = 100          # matplotlib's figure.dpi, which the inline backend keeps


def smallest_text(fig) -> tuple[float, str, float]:
    """(smallest font size in page pixels, its text, the picture's shown width in px)."""
    fig.set_dpi(DPI)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width = fig.get_tightbbox(renderer).width * DPI       # inches -> pixels, as saved
    shrink = min(1.0, NOTEBOOK_WIDTH_PX / width)
    sizes = []
    for text in fig.findobj(matplotlib.text.Text):
        shown = getattr(text, "shown", "") if hasattr(text, "candidates") else text.get_text()
        if not shown or not text.get_visible() or text.get_figure(root=True) is None:
            continue
        if hasattr(text, "candidates") and text.shown is None:
            continue
        px = renderer.points_to_pixels(text.get_fontsize()) * shrink
        sizes.append((px, shown))
    px, shown = min(sizes)
    return px, shown, width * shrink


def _figures():
    unit = pl.Costs(F=1.0, I=1.0, W=1.0)
    sim = lambda name, p=4, m=8, **kw: pl.simulate(pl.schedule(name, ranks=p, microbatches=m, **kw), unit)  # noqa: E731
    cfg = pl.ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=32)
    yield "gantt 1f1b", lambda: plots.plot_gantt(sim("1f1b"), phases=True).figure
    yield "gantt interleaved m=16 (two-digit, hatched)", lambda: plots.plot_gantt(
        sim("interleaved-1f1b", 4, 16, chunks=2)).figure
    yield "memory", lambda: plots.plot_memory(sim("gpipe")).figure
    yield "compare 2 with memory", lambda: plots.compare(
        [sim("1f1b"), sim("zb-h1")], titles=["1F1B", "ZB-H1"], memory=True)
    yield "compare p=8 m=32", lambda: plots.compare([sim("1f1b", 8, 32)], titles=["1F1B"])
    yield "schedule table", lambda: plot_schedule_table(
        schedule_table(4, 8, unit, names=["gpipe", "1f1b", "zb-h1", "zb-v"])).figure
    yield "memory vs bubble", lambda: plot_memory_bubble(memory_bubble_table(4, 8, unit)).figure
    yield "partitions", lambda: plots.plot_partitions(
        {m: pl.partition(cfg, 2, m) for m in ("uniform", "params", "cost")})
    yield "layer costs", lambda: widgets.plot_layer_costs(cfg)[0].figure
    yield "losses", lambda: widgets.plot_losses([("run 1", [4.0, 3.0, 2.5])], vocab_size=64)


@pytest.mark.parametrize("name,make", list(_figures()), ids=[n for n, _ in _figures()])
def test_no_text_below_eight_pixels_at_the_notebook_width(name, make):
    fig = make()
    try:
        px, shown, width = smallest_text(fig)
        assert width <= NOTEBOOK_WIDTH_PX + 0.5
        assert px >= MIN_TEXT_PX - 1e-6, f"{name}: {shown!r} drawn at {px:.1f} px"
    finally:
        plt.close("all")
