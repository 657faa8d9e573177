"""Notebook helpers work without a browser (the browser test drives them for real)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab import widgets  # noqa: E402


def test_layer_table_and_plot():
    cfg = pl.ModelConfig()
    table = widgets.layer_table(cfg)
    rows = pl.layer_costs(cfg)
    total = sum(r["params"] for r in rows)
    assert f"{total:,}" in table and "head" in table
    assert all(f"{r['index']:>3}  {r['name']}" in table for r in rows)   # every layer, numbered
    axes = widgets.plot_layer_costs(cfg)
    assert len(axes) == 2 and [t.get_text() for t in axes[0].get_xticklabels()][0] == "E"
    plt.close("all")


def test_plot_losses_keeps_every_run_visible_and_numbered():
    curve = [4.0, 3.0, 2.5]
    runs = [(f"run {i}: 4 layers × 64", curve) for i in range(1, 4)]
    ax = widgets.plot_losses(runs, vocab_size=64).axes[0]
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) == len(curve)]
    assert len(lines) == 3 and all(line.get_alpha() > 0.2 for line in lines)
    assert lines[-1].get_linewidth() > lines[0].get_linewidth()     # the newest is bold
    assert lines[-1].get_zorder() > lines[0].get_zorder()           # ...and drawn on top
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:3] == [label for label, _ in runs] and legend[3].startswith("uniform guess")
    plt.close("all")

    many = [(f"run {i}", curve) for i in range(1, 11)]
    ax = widgets.plot_losses(many, vocab_size=64, legend_runs=4).axes[0]
    assert sum(len(line.get_xdata()) == len(curve) for line in ax.get_lines()) == 10
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:5] == ["6 earlier runs", "run 7", "run 8", "run 9", "run 10"]
    plt.close("all")


def test_training_widget_updates_and_trains(capsys):
    box = widgets.training_widget(layers=1, width=16, steps=20)
    sliders = {c._dom_classes[0]: c for row in box.children[:2] for c in row.children}
    assert set(sliders) == {"pipelab-layers", "pipelab-width", "pipelab-steps", "pipelab-train"}
    sliders["pipelab-layers"].value = 2
    button = sliders["pipelab-train"]
    capsys.readouterr()
    button.click()                      # trains 20 steps of a 2-layer, 16-wide model
    assert not button.disabled
    # Outside a kernel the Output widget passes prints through: the run used the slider's value.
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("trained 2 layers × width 16 for 20 steps"), summary
    assert summary.endswith("; run 1: 2 layers × 16"), summary
    first, last = (float(v) for v in summary.split("loss ")[1].split(" (")[0].split(" → "))
    assert last < first
    assert "2 layers × width 16" in widgets.describe(pl.ModelConfig(n_layers=2, d_model=16))

    button.click()                      # the same configuration again: a numbered repeat
    again = capsys.readouterr().out.splitlines()[-1]
    assert again.endswith("; run 2: 2 layers × 16 (same as run 1)"), again
    assert again.split("loss ")[1] == summary.split("loss ")[1].replace("run 1", "run 2") \
        + " (same as run 1)"            # deterministic: the same curve, hence the note
    sliders["pipelab-layers"].value = 1
    button.click()
    assert capsys.readouterr().out.splitlines()[-1].endswith("; run 3: 1 layers × 16")
