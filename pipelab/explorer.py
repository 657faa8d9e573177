"""Interactive explorers for the notebooks: sliders in, simulated Gantt chart or stage balance out.

The schedule explorer draws *simulated* timelines; the balance explorer draws the FLOP model, or
measured layer times when given. Live runs are drawn from the runtime's results with the same
plotting functions.
"""
from __future__ import annotations

from typing import Sequence

from .schedules import schedule
from .simulate import Costs, simulate


def bubble_line(tl, ranks: int, microbatches: int) -> str:
    """One line comparing the simulated bubble with GPipe's closed form (p−1)/(m+p−1)."""
    formula = (ranks - 1) / (microbatches + ranks - 1)
    return (f"simulated bubble: {tl.bubble_fraction():.1%} of the makespan "
            f"({tl.bubble_ratio():.2f} × the compute);  "
            f"(p−1)/(m+p−1) = {formula:.1%}  [the formula assumes balanced stages and no communication]")


def simulate_named(name: str, ranks: int, microbatches: int, backward_ratio: float = 2.0,
                   comm: float = 0.0, **options):
    """Simulate a named schedule with F = 1 and a full backward of `backward_ratio` × F."""
    sched = schedule(name, ranks=ranks, microbatches=microbatches, **options)
    return simulate(sched, Costs.from_backward(F=1.0, B=backward_ratio, comm=comm))


def schedule_explorer(names: Sequence[str] = ("gpipe", "1f1b"), ranks: int = 4,
                      microbatches: int = 8, memory: bool = False, max_ranks: int = 8,
                      max_microbatches: int = 32):
    """Sliders for ranks, microbatches, backward:forward cost and communication cost;
    redraws the simulated Gantt chart (and memory curves) with the bubble next to the formula."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    style = {"description_width": "initial"}
    controls = {
        "name": w.Dropdown(options=list(names), value=names[0], description="schedule"),
        "ranks": w.IntSlider(value=ranks, min=1, max=max_ranks, description="ranks p", style=style),
        "microbatches": w.IntSlider(value=microbatches, min=1, max=max_microbatches,
                                    description="microbatches m", style=style),
        "backward_ratio": w.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.25,
                                        description="backward / forward cost", style=style),
        "comm": w.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05,
                              description="communication / forward cost", style=style),
    }

    def draw(name, ranks, microbatches, backward_ratio, comm):
        tl = simulate_named(name, ranks, microbatches, backward_ratio, comm)
        rows = 2 if memory else 1
        fig, axes = plt.subplots(rows, 1, figsize=(10, (1.0 + 0.45 * ranks) * rows + 0.5),
                                 squeeze=False)
        tl.plot(ax=axes[0, 0], title=f"{name}, p={ranks}, m={microbatches}")
        if memory:
            tl.plot_memory(ax=axes[1, 0], title=f"{name}, p={ranks}, m={microbatches}")
        fig.tight_layout()
        plt.show()
        print(bubble_line(tl, ranks, microbatches))
        if memory:
            peaks = tl.peak_activations()
            print("peak activations per rank (microbatch-stages): "
                  + ", ".join(f"rank {r}: {v:g}" for r, v in peaks.items()))

    if len(names) == 1:
        controls["name"].layout.display = "none"
    out = w.interactive_output(draw, controls)
    box = w.VBox([w.HBox([controls["name"], controls["ranks"], controls["microbatches"]]),
                  w.HBox([controls["backward_ratio"], controls["comm"]]), out])
    display(box)
    return box


def balance_explorer(cfg, layer_times=None, batch_size: int = 1, max_stages: int | None = None):
    """A slider for the number of stages and a dropdown for the method, redrawing the balance.

    Returns the widget (display it, or leave it as a cell's last expression).
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from .partition import METHODS, partition
    stages = widgets.IntSlider(value=min(4, cfg.total_layers), min=1,
                               max=max_stages or cfg.total_layers, description="stages")
    method = widgets.Dropdown(options=METHODS, value="cost", description="method")

    def draw(stages: int, method: str) -> None:
        parts = partition(cfg, stages, method, batch_size=batch_size, layer_times=layer_times)
        parts.plot()
        plt.show()
        print(parts.table())

    out = widgets.interactive_output(draw, {"stages": stages, "method": method})
    return widgets.VBox([widgets.HBox([stages, method]), out])
