"""Notebook helpers: the toy model's layer table and the interactive training widget.

ipywidgets and matplotlib are imported here only, so pipeline workers never load them.
"""
from __future__ import annotations

import time

import matplotlib.pyplot as plt

from ..model.gpt import ModelConfig, ToyGPT, layer_costs
from .plots import plot_layer_costs  # noqa: F401 - notebook 00 imports it from here
from ..model.train import sample, train
from . import ui


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f}"


def layer_table(cfg: ModelConfig, batch_size: int = 1) -> str:
    """The flat layer list as text: parameters and forward FLOPs per layer, with shares."""
    rows = layer_costs(cfg, batch_size)
    total_params = sum(r["params"] for r in rows)
    total_flops = sum(r["flops"] for r in rows)
    lines = [f"{'#':>3}  {'layer':<10} {'parameters':>12} {'share':>6}   "
             f"{'forward FLOPs':>13} {'share':>6}",
             "-" * 60]
    for r in rows:
        lines.append(f"{r['index']:>3}  {r['name']:<10} {r['params']:>12,} "
                     f"{r['params'] / total_params:>6.1%}   {_si(r['flops']):>13} "
                     f"{r['flops'] / total_flops:>6.1%}")
    lines += ["-" * 60,
              f"{'':>3}  {'total':<10} {total_params:>12,} {'':>6}   {_si(total_flops):>13}",
              f"(FLOPs for a batch of {batch_size} sequence(s) of {cfg.seq_len} tokens)"]
    return "\n".join(lines)


def plot_losses(runs: list[tuple[str, list[float]]], vocab_size: int, ax=None,
                legend_runs: int = 8):
    """Loss curves with the uniform-guess level ln(vocab); every run is drawn, the last one bold.

    Earlier runs stay visible, thin and semi-transparent, in their own colours; the legend names
    the newest `legend_runs` runs and sums up any older ones in one grey entry.
    """
    import math

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    older = len(runs) - legend_runs
    for i, (label, losses) in enumerate(runs):
        last = i == len(runs) - 1
        if i < older:
            style = dict(color="gray", linewidth=0.8, alpha=0.35,
                         label=f"{older} earlier run{'s' if older > 1 else ''}" if i == 0 else None)
        else:
            style = dict(color=colors[i % len(colors)], label=label,
                         linewidth=2 if last else 1, alpha=1 if last else 0.55)
        ax.plot(range(1, len(losses) + 1), losses, zorder=3 if last else 2, **style)
    ax.axhline(math.log(vocab_size), color="gray", linestyle="--", linewidth=1,
               label=f"uniform guess, ln {vocab_size} = {math.log(vocab_size):.2f}")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats per character)")
    ax.set_title("single-process training of the toy GPT")
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax.figure


def describe(cfg: ModelConfig) -> str:
    params = sum(r["params"] for r in layer_costs(cfg))
    return (f"{cfg.n_layers} layers × width {cfg.d_model}: {params:,} parameters, "
            f"{cfg.total_layers} pipeline-splittable layers (embedding + {cfg.n_layers} blocks + head)")


def format_samples(model, prompts, n: int = 40) -> str:
    """Continuations as readable text (not Python reprs): one block per prompt, the prompt in
    brackets and newlines kept as line breaks, indented under it."""
    blocks = []
    for prompt in prompts:
        text = sample(model, prompt, n=n)
        continuation = text[len(prompt):]
        lines = f"[{prompt}]{continuation}".split("\n")
        blocks.append("\n".join(["  " + lines[0]] + ["    " + line for line in lines[1:]]))
    return "\n".join(blocks)


def training_widget(layers: int = 4, width: int = 64, steps: int = 100, n_heads: int = 4):
    """Sliders for depth, width and steps; a button that trains and plots the loss curve.

    Every run is kept, numbered in the legend ("run 3: 4 layers × 80") and drawn thin behind the
    newest, so configurations can be compared. Training is deterministic: a configuration trained
    again retraces an earlier curve exactly, and the legend says which one it repeats.
    The widgets carry CSS classes (pipelab-layers, pipelab-width, pipelab-steps, pipelab-train,
    pipelab-info, pipelab-plot) that the browser test uses to find them.
    """
    import ipywidgets as w
    from IPython.display import display

    layers_slider = ui.slider("int", "layers", value=layers, min=1, max=8, continuous_update=True)
    width_slider = ui.slider("int", "width (d_model)", value=width, min=16, max=128, step=16,
                             continuous_update=True)
    steps_slider = ui.slider("int", "training steps (used by Train)", value=steps, min=20,
                             max=400, step=20)
    button = w.Button(description="Train", button_style="primary", icon="play",
                      layout=w.Layout(width="160px", margin="4px 0 4px 224px"))
    hint = w.HTML("<i>Layers and width describe the model at once; nothing trains until you "
                  "press Train, which uses all three sliders.</i>")
    for widget, name in ((layers_slider, "layers"), (width_slider, "width"),
                         (steps_slider, "steps"), (button, "train")):
        widget.add_class(f"pipelab-{name}")

    def config() -> ModelConfig:
        return ModelConfig(n_layers=layers_slider.value, d_model=width_slider.value,
                           n_heads=n_heads)

    def show_info(n_layers: int, d_model: int) -> None:
        print(describe(ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads)))

    info = ui.interactive_output(show_info, {"n_layers": layers_slider, "d_model": width_slider})
    info.add_class("pipelab-info")
    info.layout.min_height = "24px"
    plot = w.Output(layout=w.Layout(min_height="420px"))
    plot.add_class("pipelab-plot")
    runs: list[tuple[str, list[float]]] = []
    seen: dict[tuple[int, int, int], int] = {}     # (layers, width, steps) -> first run number

    def on_train(_button) -> None:
        button.disabled = True
        try:
            cfg, n_steps = config(), steps_slider.value
            with plot:
                plot.clear_output(wait=True)
                start = time.perf_counter()
                model = ToyGPT(cfg)
                losses = train(cfg, steps=n_steps, progress=True, model=model)
                elapsed = time.perf_counter() - start
                number = len(runs) + 1
                key = (cfg.n_layers, cfg.d_model, n_steps)
                label = f"run {number}: {cfg.n_layers} layers × {cfg.d_model}"
                if key in seen:
                    label += f" (same as run {seen[key]})"
                else:
                    seen[key] = number
                runs.append((label, losses))
                plot.clear_output(wait=True)
                fig = plot_losses(runs, cfg.vocab_size)
                display(fig)
                plt.close(fig)
                tail = sum(losses[-10:]) / len(losses[-10:])
                # Short lines: the output area breaks long ones anywhere, even inside a word.
                print(f"{label}: trained {cfg.n_layers} layers × width {cfg.d_model} "
                      f"for {n_steps} steps in {elapsed:.1f} s")
                print(f"loss {losses[0]:.2f} → {tail:.2f} (mean of the last 10 steps)")
                print("the model continues:")
                print(format_samples(model, ["the small "], n=40))
        finally:
            button.disabled = False

    button.on_click(on_train)
    box = w.VBox([layers_slider, width_slider, steps_slider, button, hint, info, plot])
    box.add_class("pipelab-training-widget")
    return box
