"""Closed forms against the simulator over a grid of depths p and microbatch counts m: the
`sweep` table (data) and `plot_sweep` (drawing). Re-exported by `pipelab.views.plots`."""
from __future__ import annotations

from typing import Sequence

from .plots_fit import figure_axes, place_legend
from ..schedules import schedule
from ..sim.costs import Costs
from ..sim.simulate import simulate


class SweepTable(list):
    """Rows {"p", "m", "simulated", "formula"} (formula None when none was given), plus the
    schedule name: what `plot_sweep` draws and what a notebook asserts on."""

    def __init__(self, rows=(), name: str = "", metric_name: str = ""):
        super().__init__(rows)
        self.name = name
        self.metric_name = metric_name

    def ranks(self) -> list[int]:
        return sorted({row["p"] for row in self})

    def where(self, p: int) -> list[dict]:
        return [row for row in self if row["p"] == p]

    def max_error(self) -> float:
        """Largest |simulated − formula| over the rows (0 when there is no formula)."""
        return max((abs(r["simulated"] - r["formula"]) for r in self if r["formula"] is not None),
                   default=0.0)


def sweep(name: str, ranks: Sequence[int], microbatches: Sequence[int], metric, costs=None,
          formula=None) -> SweepTable:
    """Simulate `name` for every depth p in `ranks` and m in `microbatches`; one row each with
    `metric(timeline)` and, when given, `formula(p, m)`. Data only: `plot_sweep` draws it."""
    costs = costs or Costs()
    table = SweepTable(name=name, metric_name=getattr(metric, "__name__", "metric"))
    for p in ranks:
        for m in microbatches:
            value = metric(simulate(schedule(name, ranks=p, microbatches=m), costs))
            table.append({"p": p, "m": m, "simulated": value,
                          "formula": None if formula is None else formula(p, m)})
    return table


def plot_sweep(table, *args, ylabel: str = "", ax=None, **kwargs):
    """Draw a `sweep()` table: simulated dots per depth p, the formula dashed where given.

    (The older call `plot_sweep(name, ranks, microbatches, metric, ylabel, formula=...)` still
    works: it builds the table with `sweep` first.) Returns the axes.
    """
    if isinstance(table, str):
        names = ("ranks", "microbatches", "metric", "ylabel", "formula", "ax", "costs")
        given = dict(zip(names, args), **kwargs)
        ylabel = given.pop("ylabel", ylabel)
        ax = given.pop("ax", ax)
        table = sweep(table, **given)
    ax = figure_axes(ax, figsize=(7, 3.5))
    with_formula = any(row["formula"] is not None for row in table)
    for p in table.ranks():
        rows = table.where(p)
        ms = [r["m"] for r in rows]
        line, = ax.plot(ms, [r["simulated"] for r in rows], "o", markersize=4,
                        label=f"p={p} simulated")
        if with_formula:
            ax.plot(ms, [r["formula"] for r in rows], "--", color=line.get_color(), linewidth=1,
                    label=f"p={p} formula")
    ax.set_xlabel("microbatches m")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{table.name}: simulated (dots)" + (" vs closed form (dashes)" if with_formula
                                                      else ""), fontsize=10)
    place_legend(ax, fontsize=7)
    return ax
