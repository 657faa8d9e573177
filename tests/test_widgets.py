"""Notebook helpers work without a browser (the browser test drives them for real)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pipelab as pl  # noqa: E402
from pipelab import widgets  # noqa: E402


def test_layer_table_and_plot():
    cfg = pl.ModelConfig()
    table = widgets.layer_table(cfg)
    total = sum(r["params"] for r in pl.layer_costs(cfg))
    assert f"{total:,}" in table and "block 3" in table and "head" in table
    axes = widgets.plot_layer_costs(cfg)
    assert len(axes) == 2 and [t.get_text() for t in axes[0].get_xticklabels()][0] == "E"


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
    first, last = (float(v) for v in summary.split("loss ")[1].split(" (")[0].split(" → "))
    assert last < first
    assert "2 layers × width 16" in widgets.describe(pl.ModelConfig(n_layers=2, d_model=16))
