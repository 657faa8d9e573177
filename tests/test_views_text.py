"""The words and the text in the pictures: predict feedback that names its source, refusals that
never break a word, Gantt box labels that fit their boxes, legends that hide no data."""
from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.sim.compare import simulate_named  # noqa: E402
from pipelab.views.plots import label_candidates, legend_covers, place_legend  # noqa: E402


# --- predict: the feedback says where the answer comes from ------------------------------------

def _feedback(widget, value) -> str:
    widget.field.value = value
    widget.submit()
    return re.sub("<[^>]+>", "", widget.result.value)


def test_predict_feedback_names_the_subject_it_is_given():
    peak = pl.explorer.predict("rank 0's peak under full recomputation, in KiB?", 12.5,
                               unit="KiB", subject="the byte model")
    text = _feedback(peak, "10")
    assert "wrong" in text and "the byte model gives 12.5 KiB" in text
    assert "pipeline" not in text
    plan = pl.explorer.predict("which policy does the plan use?", "selective",
                               choices=["none", "selective", "full"], subject="the planner")
    assert "right" in _feedback(plan, "selective")
    assert "the planner gives selective" in _feedback(plan, "selective")


def test_predict_keeps_the_pipeline_for_a_step_and_refuses_an_empty_subject():
    step = pl.explorer.predict("1F1B, p = 4, m = 8: makespan?", 33, unit="units")
    assert "the pipeline gives 33 units" in _feedback(step, "36")
    with pytest.raises(ValueError, match="subject"):
        pl.explorer.predict("?", 1, subject="  ")


# --- refusals: wrapped at word boundaries, never mid-word ---------------------------------------

def _refused(name: str, **kwargs) -> ValueError:
    with pytest.raises(ValueError) as info:
        pl.schedule(name, **kwargs)
    return info.value


@pytest.mark.parametrize("name, kwargs", [
    ("interleaved-1f1b", dict(ranks=3, microbatches=7, chunks=2)),
    ("zb-h2", dict(ranks=4, microbatches=6)),
    ("zb-v", dict(ranks=4, microbatches=8, chunks=3)),
    ("dualpipe", dict(ranks=3, microbatches=8)),
])
def test_a_refusal_is_wrapped_between_words(name, kwargs):
    error = _refused(name, **kwargs)
    text = pl.explorer.refusal(error, width=60)
    lines = text.splitlines()
    assert text.startswith("refused: ")
    # no line reaches the edge of the output, unless a single word is longer than the width
    assert all(len(line) <= 60 or " " not in line.strip() for line in lines)
    # the same words in the same order: only spaces became line breaks
    assert text[len("refused: "):].split() == str(error).split()
    assert len(lines) > 1                      # these messages are longer than 60 characters


def test_a_refusal_keeps_a_grid_as_it_is():
    s = pl.schedule("1f1b", ranks=2, microbatches=2)
    with pytest.raises(pl.ScheduleError) as info:
        pl.Schedule([s.actions[0], s.actions[1][:-1]], s.placement, 2).validate()
    text = pl.explorer.refusal(info.value, width=60)
    grid = [line for line in str(info.value).splitlines() if line[:1].isspace()]
    assert grid and all(line in text.splitlines() for line in grid)


def test_schedule_explorer_prints_a_refusal_instead_of_raising(capsys):
    box = pl.explorer.schedule_explorer(names=("1f1b", "zb-h2"), ranks=4, microbatches=8)
    box.controls["name"].value = "zb-h2"
    box.controls["microbatches"].value = 5       # zb-h2 needs m >= 2p - 1 = 7
    shown = capsys.readouterr().out          # outside a kernel the output area prints here
    assert "refused: zb-h2 needs microbatches" in shown
    assert max(len(line) for line in shown.split("refused:")[1].splitlines()) <= \
        pl.explorer.REFUSAL_WIDTH
    plt.close("all")


# --- Gantt box labels fit their boxes -----------------------------------------------------------

def _drawn_labels(fig):
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    drawn = []
    for ax in fig.axes:
        for event, label in getattr(ax, "pipelab_labels", {}).items():
            if label.shown is not None:
                drawn.append((ax, event, label, label.get_window_extent(renderer),
                              ax.pipelab_bars[event].get_window_extent(renderer)))
    return drawn


@pytest.mark.parametrize("name, options", [("interleaved-1f1b", dict(chunks=3)),
                                           ("interleaved-1f1b", dict(chunks=4)),
                                           ("dualpipe-v", {}), ("zb-v", {})])
def test_every_drawn_label_lies_inside_its_box_and_none_overlap(name, options):
    tl = simulate_named(name, 4, 8, pl.Costs(), **options)
    fig = pl.plots.compare([tl], titles=[name], panel_height=2.6)
    drawn = _drawn_labels(fig)
    assert drawn, "some boxes are wide enough for a label"
    for _, event, _, text, box in drawn:
        assert box.x0 <= text.x0 and text.x1 <= box.x1, event
    by_axes = {}
    for ax, _, _, text, _ in drawn:
        by_axes.setdefault(ax, []).append(text)
    for texts in by_axes.values():
        texts.sort(key=lambda b: (round(b.y0), b.x0))
        for a, b in zip(texts, texts[1:]):
            if abs(a.y0 - b.y0) < 1:
                assert a.x1 <= b.x0, "two labels on one row run together"
    plt.close(fig)


def test_labels_shorten_on_a_narrow_figure_and_come_back_on_a_wide_one():
    tl = simulate_named("interleaved-1f1b", 4, 8, pl.Costs(), chunks=2)
    fig = pl.plots.compare([tl], titles=["v=2"])
    wide = {label.shown for *_, label, _, _ in _drawn_labels(fig)}
    assert "3'" in wide                      # the chunk mark where there is room
    fig.set_size_inches(3, fig.get_figheight())
    narrow = _drawn_labels(fig)
    assert len(narrow) < len(wide) or all("'" not in label.shown for *_, label, _, _ in narrow)
    fig.set_size_inches(10, fig.get_figheight())
    assert {label.shown for *_, label, _, _ in _drawn_labels(fig)} == wide
    plt.close(fig)


def test_a_two_digit_microbatch_too_wide_at_the_chart_size_is_drawn_smaller_not_dropped():
    # 16 microbatches of GPipe on 2 ranks at 4.5 inches: the boxes are too narrow for "10" at
    # the chart's font size but not a size smaller (never below 8 px: at 4 inches they vanish).
    tl = pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=16), pl.Costs())
    fig = pl.plots.compare([tl], titles=["gpipe"])
    fig.set_size_inches(4.5, fig.get_figheight())
    drawn = _drawn_labels(fig)
    two_digits = [label for *_, label, _, _ in drawn if label.shown in {"10", "11", "12", "15"}]
    assert two_digits, "two-digit microbatches keep their label"
    assert all(label.get_fontsize() < label.base_size for label in two_digits)
    assert all(label.get_fontsize() * fig.dpi / 72 >= 8 - 1e-9 for label in two_digits)
    for _, event, _, text, box in drawn:
        assert box.x0 <= text.x0 and text.x1 <= box.x1, event
    plt.close(fig)


def test_label_candidates_shorten_a_compound_step():
    tl = simulate_named("dualpipe-v", 4, 8, pl.Costs())
    pair = next(e for e in tl.events if len(e.action.parts) == 2)
    chunks = pl.plots.chunk_of(tl)
    full, plain, first = label_candidates(pair.action.parts, chunks)
    assert "/" in full and "'" in full and plain == full.replace("'", "")
    assert first == str(pair.action.parts[0].microbatch)


# --- legends that hide no data ------------------------------------------------------------------

def _axes_with_lines(fill: bool):
    fig, ax = plt.subplots(figsize=(5, 3))
    xs = list(range(20))
    if fill:       # lines through every corner of the axes: nowhere inside is free
        for level in range(0, 11):
            ax.plot(xs, [level] * 20, label=f"level {level}")
    else:          # lines along the bottom: the top is free
        ax.plot(xs, [0.1 * x for x in xs], label="low")
        ax.plot(xs, [0.05 * x for x in xs], label="lower")
        ax.set_ylim(0, 10)
    return fig, ax


def test_best_legend_stays_inside_where_it_hides_nothing():
    fig, ax = _axes_with_lines(fill=False)
    shown = place_legend(ax, where="best")
    assert ax.pipelab_legend_where == "best" and legend_covers(ax, shown) == 0
    plt.close(fig)


def test_best_legend_moves_outside_when_every_spot_covers_a_line():
    fig, ax = _axes_with_lines(fill=True)
    inside = ax.legend(loc="best")
    assert legend_covers(ax, inside) > 0          # the check sees what matplotlib's best hides
    inside.remove()
    shown = place_legend(ax, where="best")
    renderer = fig.canvas.get_renderer()
    assert ax.pipelab_legend_where == "outside"
    assert shown.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    plt.close(fig)


def test_timeline_legends_sit_outside_the_axes():
    tl = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), pl.Costs())
    fig = pl.plots.compare([tl], memory=True)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        assert legend_covers(ax) == 0
        assert ax.get_legend().get_window_extent(renderer).x0 >= \
            ax.get_window_extent(renderer).x1 - 1
    with pytest.raises(ValueError, match="where"):
        place_legend(fig.axes[0], where="inside")
    plt.close(fig)


# --- memory curves that coincide stay visible ---------------------------------------------------

def test_mirrored_ranks_with_the_same_memory_curve_both_show():
    """DualPipe's rank 3 holds exactly what rank 0 holds: drawn alike, rank 3's line would cover
    rank 0's entirely. Both colours must reach the picture, and the legend names the twin."""
    import numpy as np
    from matplotlib.colors import to_rgb
    tl = pl.simulate(pl.schedule("dualpipe", ranks=4, microbatches=8), pl.Costs())
    assert tl.memory_curve(0) == tl.memory_curve(3)          # the case this guards
    fig = pl.plots.compare([tl], memory=True, gantt=False)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    ax.get_legend().set_visible(False)        # its swatches would show every colour anyway
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255
    for line in ax.get_lines():
        colour = np.array(to_rgb(line.get_color()))
        seen = (np.abs(pixels - colour).max(axis=-1) < 0.02).sum()
        assert seen > 20, f"{line.get_label()}: its colour is hidden"
    assert any(label.startswith("rank 3 = rank 0") for label in labels)
    assert any(label.startswith("rank 2 = rank 1") for label in labels)
    plt.close(fig)


def test_expect_refusal_prints_the_reason_and_fails_when_nothing_is_refused(capsys):
    with pl.explorer.expect_refusal("equal rounds"):
        pl.schedule("interleaved-1f1b", ranks=3, microbatches=7, chunks=2)
    shown = capsys.readouterr().out
    assert shown.startswith("refused: interleaved-1f1b needs")
    assert max(map(len, shown.splitlines())) <= pl.explorer.REFUSAL_WIDTH
    with pytest.raises(AssertionError, match="but the block ran"):
        with pl.explorer.expect_refusal():
            pl.schedule("interleaved-1f1b", ranks=4, microbatches=8, chunks=2)
    with pytest.raises(AssertionError, match="does not match"):
        with pl.explorer.expect_refusal("no such words"):
            pl.schedule("zb-h2", ranks=4, microbatches=6)
    with pytest.raises(ZeroDivisionError):              # only refusals are caught
        with pl.explorer.expect_refusal():
            1 / 0
