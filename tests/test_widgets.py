"""Notebook helpers work without a browser (the browser test drives them for real)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.views import ui, widgets  # noqa: E402


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


def _training_parts(box):
    return {c._dom_classes[0]: c for c in box.children if c._dom_classes}


def test_training_widget_layout_one_control_per_row():
    box = widgets.training_widget(layers=1, width=16, steps=20)
    parts = _training_parts(box)
    sliders = [parts[f"pipelab-{n}"] for n in ("layers", "width", "steps")]
    assert all(s in box.children for s in sliders)              # one per row, not in HBoxes
    assert {s.style.description_width for s in sliders} == {"220px"}
    assert {s.layout.width for s in sliders} == {ui.CONTROL_WIDTH}
    assert "Train" in parts["pipelab-steps"].description        # steps act when Train is pressed
    assert parts["pipelab-plot"].layout.min_height              # the page does not jump


def test_format_samples_prints_text_not_reprs():
    model = pl.ToyGPT(pl.ModelConfig(n_layers=1, d_model=16))
    text = widgets.format_samples(model, ["ab", "c"], n=5)
    lines = text.splitlines()
    assert lines[0].startswith("  [ab]") and any(line.startswith("  [c]") for line in lines)
    assert "\\n" not in text and "'" not in text


def test_training_widget_updates_and_trains(capsys):
    box = widgets.training_widget(layers=1, width=16, steps=20)
    parts = _training_parts(box)
    assert {"pipelab-layers", "pipelab-width", "pipelab-steps", "pipelab-train"} <= set(parts)
    parts["pipelab-layers"].value = 2
    button = parts["pipelab-train"]
    capsys.readouterr()
    button.click()                      # trains 20 steps of a 2-layer, 16-wide model
    assert not button.disabled
    # Outside a kernel the Output widget passes prints through: the run used the slider's value.
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith("run 1:"))
    assert head.startswith("run 1: 2 layers × 16: trained 2 layers × width 16 for 20 steps"), head
    loss = next(line for line in out if line.startswith("loss "))
    assert max(len(line) for line in out) < 90          # no line long enough to wrap mid-word
    first, last = (float(v) for v in loss.split("loss ")[1].split(" (")[0].split(" → "))
    assert last < first
    assert any(line.startswith("  [the small ]") for line in out)
    assert "2 layers × width 16" in widgets.describe(pl.ModelConfig(n_layers=2, d_model=16))

    button.click()                      # the same configuration again: a numbered repeat
    again = capsys.readouterr().out.splitlines()
    assert any(line.startswith("run 2: 2 layers × 16 (same as run 1): trained") for line in again)
    assert next(line for line in again if line.startswith("loss ")) == loss   # deterministic
    parts["pipelab-layers"].value = 1
    button.click()
    assert any(line.startswith("run 3: 1 layers × 16: trained")
               for line in capsys.readouterr().out.splitlines())


def test_explorers_use_the_shared_layout():
    import ipywidgets as w
    box = pl.explorer.schedule_explorer(names=("gpipe", "1f1b"), ranks=2, microbatches=2)
    controls = box.controls
    assert set(controls) >= {"fixed_batch", "critical_path", "comm"}
    assert controls["fixed_batch"].value is True and controls["critical_path"].value is False
    rows = [c for c in box.children if not isinstance(c, w.Output)]
    assert rows == list(controls.values())                       # one control per row
    assert all(c.style.description_width == "220px" for c in rows)
    assert all(c.layout.width == ui.CONTROL_WIDTH for c in rows)
    assert box.children[-1].layout.min_height
    balance = pl.explorer.balance_explorer(pl.ModelConfig())
    assert [type(c).__name__ for c in balance.children] == ["IntSlider", "Dropdown", "Output"]
    assert balance.children[0].layout.width == ui.CONTROL_WIDTH
    plt.close("all")


def test_plot_partitions_and_the_basis_toggle(capsys):
    cfg = pl.ModelConfig(n_layers=4)
    flops = {m: pl.partition(cfg, 2, m) for m in ("uniform", "params", "cost")}
    times = [1.0] + [0.1] * (cfg.total_layers - 1)            # a slow embedding moves the cut
    measured = {m: pl.partition(cfg, 2, m, layer_times=times) for m in flops}
    assert measured["cost"].layout != flops["cost"].layout
    fig = pl.plots.plot_partitions(flops, note="FLOPs")
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in shown] == [f"{m}: {p.layout}  (FLOPs)" for m, p in flops.items()]
    assert not fig.axes[3].get_visible()                       # 3 charts on a 2 × 2 grid
    assert shown[0].get_ylabel() and not shown[1].get_ylabel() and shown[2].get_ylabel()
    plt.close("all")
    box = pl.explorer.basis_toggle({"FLOPs (model)": flops, "measured (this run)": measured})
    assert list(box.basis.options) == ["FLOPs (model)", "measured (this run)"]
    assert box.basis.layout.width == ui.CONTROL_WIDTH
    box.basis.value = "measured (this run)"
    assert f"cost split on measured (this run): {measured['cost'].layout}" in capsys.readouterr().out
    box.basis.value = "FLOPs (model)"
    assert f"cost split on FLOPs (model): {flops['cost'].layout}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="same partitions"):
        pl.explorer.basis_toggle({"a": flops, "b": {"cost": flops["cost"]}})
    plt.close("all")


def test_interactive_output_keeps_the_outputs_in_the_widget_state():
    import ipywidgets as w
    slider = w.IntSlider(value=1, min=0, max=3)

    def draw(x: int) -> None:
        print(f"x is {x}")
        if x == 3:
            raise ValueError("three is refused")
        print("end", file=__import__("sys").stderr)

    out = ui.interactive_output(draw, {"x": slider})
    assert [(o["output_type"], o.get("name")) for o in out.outputs] == [("stream", "stdout"),
                                                                         ("stream", "stderr")]
    assert ui.text_of(out) == "x is 1\nend\n"
    slider.value = 2                       # the view is replaced, not appended to
    assert ui.text_of(out) == "x is 2\nend\n"
    slider.value = 3                       # an exception is shown in the widget, not raised
    assert ui.text_of(out) == "x is 3\n"
    assert out.outputs[-1]["output_type"] == "error" and "three is refused" in out.outputs[-1]["evalue"]


def test_ui_interact_gives_a_headless_executor_nothing_to_wait_for():
    """nbclient (jupyter nbconvert --execute) mimics the Output widget: for each output routed
    into it with `with out:` it sends a message back to the kernel on the shell socket while it
    waits for the execute reply there, and under load it can miss that reply forever. ui.interact
    renders in the kernel: no output is routed, so the client registers no output hook."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    plot = ("def show(x=2):\n    print(f'value {x}')\n    plt.plot([0, x]); plt.show()\n")
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nimport ipywidgets\n"
        "from pipelab import ui\n" + plot,
        "ipywidgets.interact(show, x=(0, 4));",
        "ui.interact(show, x=(0, 4));")]
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    hooks: list[int] = []
    register = client.register_output_hook
    client.register_output_hook = lambda msg_id, hook: (hooks.append(cell), register(msg_id, hook))
    with client.setup_kernel():
        for cell, source in enumerate(nb.cells):
            client.execute_cell(source, cell)
    assert 1 in hooks                      # the mechanism is seen: ipywidgets routes its output
    assert 2 not in hooks                  # ...and ui.interact does not
    outputs = [state["outputs"] for state in client.widget_state.values()
               if state.get("_model_name") == "OutputModel" and state.get("outputs")]
    ours = outputs[-1]                     # the widget state of ui.interact's view
    assert ours[0] == {"output_type": "stream", "name": "stdout", "text": "value 2\n"}
    assert "image/png" in ours[1]["data"]
