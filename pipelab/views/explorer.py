"""Interactive explorers for the notebooks, and the teaching widgets they are built from.

- `schedule_explorer`: sliders in, simulated Gantt chart (fixed batch or per microbatch,
  critical path on request) out; `balance_explorer`: stage balance of a partition.
- `player`: play a timeline back (what runs, what flies, what is live at t) — player.py.
- `predict`: the reader commits to a number before the notebook shows it — predict.py.
- `live_compare`: run several schedules fairly on one cluster (warm-up, alternating rounds).
- `refusal` / `expect_refusal`: what a setting is refused for, wrapped between words.

Every control follows ui.py: one per row, 220-px labels, long tracks, outputs of stable height.
"""
from __future__ import annotations

import contextlib
import re
import statistics
import textwrap
from typing import Mapping, Sequence

from .player import messages_in_flight, live_activations, player, running_at, status  # noqa: F401
from .predict import predict  # noqa: F401
from ..sim.compare import simulate_named
from ..sim.costs import Costs
from . import plots, ui
from ..support import noise
from ..sim.partition import METHODS, partition


def bubble_line(tl, ranks: int, microbatches: int) -> str:
    """One line comparing the simulated bubble with GPipe's closed form (p−1)/(m+p−1)."""
    formula = (ranks - 1) / (microbatches + ranks - 1)
    return (f"simulated bubble: {tl.bubble_fraction():.1%} of the makespan "
            f"({tl.bubble_ratio():.2f} × the compute);  "
            f"(p−1)/(m+p−1) = {formula:.1%}\n"
            f"  [the formula assumes balanced stages and no communication]")


# JupyterLab shows printed text with `word-break: break-all`: a line longer than the output
# area is cut wherever the edge falls, mid-word ("throu" / "gh"). Lines kept under ~90
# monospace characters (about 700 px at 13 px) never reach the edge of a 1,000-px page.
REFUSAL_WIDTH = 88


def refusal(error, width: int = REFUSAL_WIDTH, prefix: str = "refused: ") -> str:
    """An error's message as an explorer prints it: `prefix` + the message, every prose line
    wrapped at word boundaries within `width` characters (continuation lines indented), so the
    browser never breaks a word. Lines that start with a space (a grid, a table) are kept."""
    if width < len(prefix) + 20:
        raise ValueError(f"width must leave at least 20 characters after the prefix, got {width}")
    lines = []
    for k, line in enumerate(str(error).splitlines() or [""]):
        first = prefix if k == 0 else ""
        if line[:1].isspace() or len(first + line) <= width:
            lines.append(first + line)
            continue
        lines.append(textwrap.fill(line, width, initial_indent=first, subsequent_indent="  ",
                                   break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)


@contextlib.contextmanager
def expect_refusal(match: str | None = None, width: int = REFUSAL_WIDTH):
    """A cell that shows what pipelab refuses, without a traceback: the block must raise a
    ValueError (a ScheduleError is one), whose message is printed wrapped between words
    (`refusal`); `match` (a regular expression) must then be found in it. A block that raises
    nothing, or a message without `match`, fails the cell with an AssertionError.

        with pl.explorer.expect_refusal("equal rounds"):
            pl.schedule("interleaved-1f1b", ranks=3, microbatches=7, chunks=2)
    """
    try:
        yield
    except ValueError as error:
        print(refusal(error, width))
        if match is not None and not re.search(match, str(error)):
            raise AssertionError(f"refused, but the message does not match {match!r}") from error
    else:
        raise AssertionError("expected a refusal (a ValueError), but the block ran")


GANTT_HEIGHT = 2.6      # inches, whatever p: the explorer's output keeps its height


def schedule_explorer(names: Sequence[str] = ("gpipe", "1f1b"), ranks: int = 4,
                      microbatches: int = 8, memory: bool = False, max_ranks: int = 8,
                      max_microbatches: int = 32, fixed_batch: bool = True,
                      critical_path: bool = False):
    """Sliders for ranks, microbatches, backward:forward cost and message latency; a
    "fixed global batch" switch and a "critical path" switch; redraws the simulated Gantt chart
    (and memory curves) with the bubble next to the formula.

    Fixed global batch (default on): F + B is the cost of the *whole* batch, split over the m
    microbatches, so m = 1 (naive) and m = 8 (GPipe) do the same work and the makespan falls as
    m grows. Off: each microbatch costs F + B, as in the papers' tables (makespan 3(m+p−1)).
    Displays the widget and returns it.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    controls = {
        "name": ui.control(w.Dropdown, "schedule", options=list(names), value=names[0]),
        "ranks": ui.slider("int", "ranks p", value=ranks, min=1, max=max_ranks),
        "microbatches": ui.slider("int", "microbatches m", value=microbatches, min=1,
                                  max=max_microbatches),
        "backward_ratio": ui.slider("float", "backward / forward cost", value=2.0, min=0.5,
                                    max=4.0, step=0.25),
        "comm": ui.slider("float", "message latency / forward cost", value=0.0, min=0.0,
                          max=1.0, step=0.05),
        "fixed_batch": ui.control(w.Checkbox, "fixed global batch (costs per batch)",
                                  value=fixed_batch, indent=True),
        "critical_path": ui.control(w.Checkbox, "mark the critical path", value=critical_path,
                                    indent=True),
    }

    def draw(name, ranks, microbatches, backward_ratio, comm, fixed_batch, critical_path):
        per = "batch" if fixed_batch else "microbatch"
        # F = 1 and B = backward_ratio per rank's worth of layers (divided among its chunks):
        # one microbatch's costs, or the whole batch's with the fixed-batch toggle.
        try:
            tl = simulate_named(name, ranks, microbatches,
                                Costs.from_backward(F=1.0, B=backward_ratio, comm=comm, per=per))
        except ValueError as error:         # a shape the schedule refuses: say why, in words
            print(refusal(error))
            return
        plots.compare([tl], titles=[f"{name}, p={ranks}, m={microbatches}"],
                      memory=memory, critical_path=critical_path, phases=True,
                      panel_height=GANTT_HEIGHT)
        plt.show()
        if fixed_batch:
            print(f"fixed batch: F + B of the whole batch = {1 + backward_ratio:g}, "
                  f"so each of the {microbatches} microbatches costs {1 + backward_ratio:g}/m "
                  f"= {(1 + backward_ratio) / microbatches:.3g}; message latency {comm:g}")
        else:
            print(f"per microbatch: each of the {microbatches} microbatches costs "
                  f"F + B = {1 + backward_ratio:g}; message latency {comm:g}")
        print(f"makespan {tl.makespan:.4g}; " + bubble_line(tl, ranks, microbatches))
        if critical_path:
            print(plots.path_summary(tl))
        if memory:
            peaks = tl.peak_activations()
            print("peak activations per rank (microbatch-stages): "
                  + ", ".join(f"rank {r}: {v:g}" for r, v in peaks.items()))

    if len(names) == 1:
        controls["name"].layout.display = "none"
    panels = 1 + (1.5 if memory else 0)
    out = ui.interactive_output(draw, controls)
    out.layout.min_height = f"{int(100 * (GANTT_HEIGHT * panels + 1.5) + 20 * 6)}px"
    box = w.VBox(list(controls.values()) + [out])
    box.add_class("pipelab-schedule-explorer")
    box.controls = controls
    display(box)      # shown here, as notebooks call it with a trailing `;`
    return box


VIEWS = ("timeline", "replay", "simulated")     # measured, replayed, simulated from fitted costs


def median_run(runs: Sequence, view: str = "timeline"):
    """The run whose `view` makespan is the median of the runs' (the lower middle one for an
    even count): `view` is "timeline" (measured wall clock), "replay" or "simulated". A chart
    beside a printed median draws this run's `view`, picked by the same statistic: the run with
    the median wall clock need not have the median replay (05 drew a ZB-H1 replay of 127 ms
    under a table saying 99.5 ms)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
    if not runs:
        raise ValueError("median_run needs at least one run")
    ordered = sorted(runs, key=lambda r: getattr(r, view).makespan)
    return ordered[(len(ordered) - 1) // 2]


class LiveComparison(dict):
    """name -> the median RunResult of its rounds (by measured makespan); `.runs[name]` holds
    every round's result. To draw what a table prints, pick by the printed statistic:
    `.pick(name, "replay")` is the run whose replay is the median one, `.view(name, "replay")`
    its replayed timeline, titled as the median of the rounds."""

    def pick(self, name: str, view: str = "timeline"):
        """The run of `name` whose `view` makespan is the median of its rounds (`median_run`)."""
        if name not in self.runs:
            raise ValueError(f"name must be one of {', '.join(self.runs)}, got {name!r}")
        return median_run(self.runs[name], view)

    def view(self, name: str, view: str = "timeline"):
        """The timeline to draw beside a printed median of `view`: the median run's own, its
        title saying which run of how many it is (a copy: the run keeps its own)."""
        run = self.pick(name, view)
        timeline = getattr(run, view)
        rounds = len(self.runs[name])
        what = {"timeline": "measured", "replay": "replayed", "simulated": "simulated"}[view]
        note = (f"{name}, {what} {timeline.makespan * 1e3:.1f} ms: the median of {rounds} rounds"
                if rounds % 2 else f"{name}, {what} {timeline.makespan * 1e3:.1f} ms: the lower "
                f"middle of {rounds} rounds")
        return _retitled(timeline, note)

    def medians(self, view: str = "timeline") -> dict[str, float]:
        """name -> the makespan (s) of `view` that `pick(name, view)` draws (for an odd number
        of rounds, the median of the rounds)."""
        return {name: getattr(self.pick(name, view), view).makespan for name in self.runs}

    def __init__(self, runs: dict):
        super().__init__({name: median_run(results) for name, results in runs.items()})
        self.runs = runs

    def table(self) -> str:
        lines = [f"{'schedule':<20}{'median (ms)':>12}{'min':>9}{'max':>9}   rounds (ms)"]
        for name, results in self.runs.items():
            times = [r.timeline.makespan * 1e3 for r in results]
            # median_low: the very run `self[name]` is (an even count has no middle run)
            lines.append(f"{name:<20}{statistics.median_low(times):12.2f}{min(times):9.2f}"
                         f"{max(times):9.2f}   " + " ".join(f"{t:.1f}" for t in times))
        lines.append(self.load_line)
        return "\n".join(lines)

    @property
    def load_line(self) -> str:
        """The load the rounds ran at: the lowest and highest 1-minute load average seen as a
        run was sent or came back (measured milliseconds mean little without it)."""
        import os
        results = [r for rounds in self.runs.values() for r in rounds]
        seen = [x for r in results if getattr(r, "load", None) is not None for x in r.load]
        if not seen:
            return "load average not recorded"
        return (f"measured at load average {min(seen):.2f} to {max(seen):.2f} over "
                f"{len(results)} runs on {os.cpu_count()} cores")


def _retitled(timeline, title: str):
    import copy
    other = copy.copy(timeline)
    other.title = title
    return other


def live_compare(cluster, schedules, *, rounds: int = 3, warmup: bool = True, **run_kwargs):
    """Run several contenders on one cluster fairly: one discarded warm-up run of each, then
    `rounds` rounds that run every contender once, in alternating order (A B, B A, A B...), so
    that cold workers or background load never favour one of them.

    `schedules`: {name: Schedule}, {name: (Schedule, {run settings})} (e.g. the same schedule
    on two partitions: {"uniform": (gpipe, {"partition": u}), "cost": (gpipe, {"partition":
    c})}), or a list of Schedules (named by `.name`). `run_kwargs` go to every `cluster.run`
    (model=, batch_size=, ...); a contender's own settings are added to them and win on a
    clash. Returns a LiveComparison: name -> the median run (by measured makespan), with
    `.runs[name]` = every round's RunResult and `.table()`.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not isinstance(schedules, Mapping):
        schedules = {s.name: s for s in schedules}
    contenders = {}
    for name, entry in schedules.items():
        if isinstance(entry, tuple):
            if len(entry) != 2 or not isinstance(entry[1], Mapping):
                raise ValueError(f"contender {name!r}: give a Schedule or (Schedule, "
                                 f"{{run settings}}), got a tuple of {len(entry)}")
            sched, own = entry
        else:
            sched, own = entry, {}
        contenders[name] = (sched, {**run_kwargs, **own})
    names = list(contenders)
    if len(names) < 1:
        raise ValueError("live_compare needs at least one schedule")

    def run(name):
        sched, kwargs = contenders[name]
        return cluster.run(sched, **kwargs)

    runs: dict[str, list] = {name: [] for name in names}
    total = len(names) * (rounds + bool(warmup))
    # One line from the first second: runs done / total, elapsed, load, where the run is.
    with noise.Progress(f"live_compare ({' vs '.join(names)})", total=total) as line:
        if warmup:
            for name in names:
                line.detail(f"warm-up {name}")
                run(name)
                line.advance()
        for k in range(rounds):
            for name in (names if k % 2 == 0 else names[::-1]):
                line.detail(f"round {k + 1}/{rounds} {name}")
                runs[name].append(run(name))
                line.advance()
    return LiveComparison(runs)


def balance_explorer(cfg, layer_times=None, batch_size: int = 1, max_stages: int | None = None):
    """A slider for the number of stages and a dropdown for the method, redrawing the balance.

    Returns the widget (display it, or leave it as a cell's last expression).
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    stages = ui.slider("int", "stages", value=min(4, cfg.total_layers), min=1,
                       max=max_stages or cfg.total_layers)
    method = ui.control(widgets.Dropdown, "method", options=METHODS, value="cost")

    def draw(stages: int, method: str) -> None:
        parts = partition(cfg, stages, method, batch_size=batch_size, layer_times=layer_times)
        parts.plot()
        plt.show()
        print(parts.table())

    out = ui.interactive_output(draw, {"stages": stages, "method": method})
    out.layout.min_height = "520px"
    box = widgets.VBox([stages, method, out])
    box.add_class("pipelab-balance-explorer")
    return box


def basis_toggle(views: Mapping[str, Mapping], key: str = "cost"):
    """Toggle buttons that redraw the same partitions computed on different bases, e.g.
    {"FLOPs (model)": {method: Partition}, "measured (this run)": {method: Partition}}: the
    balance charts side by side (`plots.plot_partitions`), then the `key` method's layout on
    the chosen basis. Returns the widget; `.basis` is the toggle, `.views` the partitions."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    if not views:
        raise ValueError("basis_toggle needs at least one basis")
    names = [set(parts) for parts in views.values()]
    if any(n != names[0] for n in names) or key not in names[0]:
        raise ValueError(f"every basis must hold the same partitions, including {key!r}; got "
                         + ", ".join(f"{b}: {sorted(p)}" for b, p in views.items()))
    basis = ui.control(widgets.ToggleButtons, "balance on", options=list(views))

    def draw(basis: str) -> None:
        plots.plot_partitions(views[basis], note=basis)
        plt.show()
        print(f"{key} split on {basis}: {views[basis][key].layout}")

    out = ui.interactive_output(draw, {"basis": basis})
    out.layout.min_height = "700px"
    box = widgets.VBox([basis, out])
    box.add_class("pipelab-basis-toggle")
    box.basis, box.views = basis, views
    return box
