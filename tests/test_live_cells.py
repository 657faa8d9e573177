"""What a learner's live cell does around its runs: one torch thread in the kernel while the
workers run, a progress line from the first second, a busy sign on every explorer's redraw."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.runtime import cluster as cluster_module  # noqa: E402
from pipelab.support import noise  # noqa: E402
from pipelab.views import ui  # noqa: E402

TINY = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)


# --- threads ---------------------------------------------------------------------------------

def test_the_kernel_keeps_one_thread_while_its_workers_run_and_gets_its_own_back(clusters,
                                                                                monkeypatch):
    seen = []
    collect, assemble = cluster_module.LocalCluster._collect, cluster_module.assemble

    def watched_collect(self, *args):
        seen.append(("collect", torch.get_num_threads()))
        return collect(self, *args)

    def watched_assemble(*args, **kwargs):       # the gradient check runs in the parent
        seen.append(("check", torch.get_num_threads()))
        return assemble(*args, **kwargs)

    monkeypatch.setattr(cluster_module.LocalCluster, "_collect", watched_collect)
    monkeypatch.setattr(cluster_module, "assemble", watched_assemble)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=2), model=TINY)
        assert torch.get_num_threads() == 2            # the kernel's own work gets both back
    finally:
        torch.set_num_threads(threads)
    assert seen == [("collect", 1), ("check", 1)]
    assert res.max_grad_error <= 1e-5


# --- progress lines ----------------------------------------------------------------------------

def test_a_progress_line_shows_at_once_counts_and_carries_a_nested_run():
    stream = io.StringIO()
    with noise.Progress("A vs B", total=3, unit="rounds", enabled=True, stream=stream) as line:
        first = stream.getvalue()
        with noise.Progress("1f1b") as inner:          # a run inside: no line of its own
            assert inner.line is None and inner.enabled
            inner.detail("actions 1/4 0/4", force=True)
        shown = stream.getvalue()
        line.advance()
        after = stream.getvalue()
    assert first.startswith("\rA vs B: 0/3 rounds · 0.0 s · load "), first
    assert "· 1f1b · actions 1/4 0/4" in shown
    assert "A vs B: 1/3 rounds" in after.rsplit("\r", 1)[-1] or "1/3 rounds" in after
    assert stream.getvalue().endswith("\r")            # erased at the end
    assert noise._OPEN == []


def test_a_quiet_progress_keeps_its_runs_quiet():
    stream = io.StringIO()
    with noise.Progress("x", total=2, enabled=False, stream=stream):
        with noise.Progress("run") as inner:
            assert not inner.enabled
            inner.detail("actions 1/2", force=True)
    assert stream.getvalue() == ""


def test_live_compare_and_paired_rounds_count_their_runs(clusters, monkeypatch):
    lines = []
    real = noise.StatusLine.update

    def record(self, text, force=False):
        lines.append(text)
        return real(self, text, force)

    monkeypatch.setattr(noise, "watched", lambda: True)
    monkeypatch.setattr(noise.StatusLine, "update", record)
    monkeypatch.setattr(noise.StatusLine, "_write", lambda self, text: None)
    cluster = clusters(2)
    scheds = {"gpipe": pl.schedule("gpipe", ranks=2, microbatches=2),
              "1f1b": pl.schedule("1f1b", ranks=2, microbatches=2)}
    pl.explorer.live_compare(cluster, scheds, rounds=1, warmup=True, model=TINY, check=False)
    assert lines[0].startswith("live_compare (gpipe vs 1f1b): 0/4 runs · ")   # before any run
    assert any(t.startswith("live_compare (gpipe vs 1f1b): 4/4 runs") for t in lines)
    assert any("warm-up gpipe" in t for t in lines)
    lines.clear()
    sched = scheds["1f1b"]
    noise.paired_rounds(lambda: cluster.run(sched, model=TINY, check=False).wall_time,
                        lambda: cluster.run(sched, model=TINY, check=False).wall_time,
                        rounds=2, labels=("A", "B"))
    assert lines[0].startswith("A vs B: 0/2 rounds")
    assert any(t.startswith("A vs B: 2/2 rounds") for t in lines)


# --- the busy sign -----------------------------------------------------------------------------

def test_every_explorer_redraw_shows_a_busy_sign_before_it_starts():
    import ipywidgets as w
    slider = ui.slider("int", "ranks p", value=2, min=1, max=8)
    during, held = [], {}

    def draw(ranks):
        if held:
            during.append((ui.is_busy(held["out"]), ui.text_of(held["out"])))
        print(f"drawn for p = {ranks}")

    out = held["out"] = ui.interactive_output(draw, {"ranks": slider})
    assert not ui.is_busy(out) and ui.text_of(out) == "drawn for p = 2\n"
    slider.value = 5
    busy, text = during[-1]
    assert busy and text.startswith("⏳ working… redrawing for ranks p = 5\n")
    assert "drawn for p = 2" in text                   # the old picture stays under the sign
    assert not ui.is_busy(out) and ui.text_of(out) == "drawn for p = 5\n"

    seen = []

    def shown(x=1):
        if hasattr(f, "widget"):
            seen.append(ui.is_busy(f.widget.out))

    f = shown
    ui.interact(shown, x=w.IntSlider(value=1, min=0, max=3))
    f.widget.children[0].value = 2
    assert seen[-1] is True and not ui.is_busy(f.widget.out)


def test_a_progress_line_inside_a_redraw_leaves_one_output_or_none(monkeypatch):
    monkeypatch.setattr(noise, "watched", lambda: True)
    from IPython.core.interactiveshell import InteractiveShell
    InteractiveShell.instance()                         # a shell, as in a kernel
    monkeypatch.setattr(noise, "in_kernel", lambda: True)

    def draw():
        with noise.Progress("run", total=2) as line:
            line.advance()
            line.advance()
        print("done")

    try:
        outputs, _ = ui.collect_outputs(draw)
    finally:
        InteractiveShell.clear_instance()             # later tests run outside IPython
    assert [o["output_type"] for o in outputs] == ["stream"], outputs


# --- one rule for live pictures: the run drawn is the run whose numbers are printed ------------

def _runs(pairs):
    from types import SimpleNamespace as NS
    from pipelab.sim.timeline import Timeline
    return [NS(timeline=Timeline([], ranks=1, title="m"), replay=Timeline([], ranks=1),
               _m=m, _r=r) for m, r in pairs]


def test_the_picture_beside_a_printed_median_is_the_median_run_by_that_statistic(monkeypatch):
    from pipelab.sim.timeline import Timeline
    from pipelab.views.explorer import LiveComparison, median_run
    monkeypatch.setattr(Timeline, "makespan", property(lambda self: self._span), raising=False)
    # 05's case: the run with the median wall clock has the slowest replay
    runs = _runs([(0.080, 0.1274), (0.070, 0.0950), (0.090, 0.0995)])
    for run in runs:
        run.timeline._span, run.replay._span = run._m, run._r
    live = LiveComparison({"zb-h1": runs})
    assert live["zb-h1"] is runs[0] and median_run(runs) is runs[0]          # by wall clock
    assert live.pick("zb-h1", "replay") is runs[2]                           # by replay
    assert live.medians("replay") == {"zb-h1": 0.0995}
    drawn = live.view("zb-h1", "replay")
    assert drawn.makespan == 0.0995 and "replayed 99.5 ms: the median of 3 rounds" in drawn.title
    assert runs[2].replay.title == ""                                        # the run keeps its own
    assert "zb-h1                      80.00" in live.table()            # the drawn run's figure
    with pytest.raises(ValueError, match="view must be one of"):
        live.pick("zb-h1", "replayed")
