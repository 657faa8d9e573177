"""Schedules side by side, for the same model: the logic behind notebooks 04 and 05.

Every comparison here holds the *model* fixed, not the stage: a `pl.Costs` is one rank's worth
of layers, and `simulate` divides it over a schedule's chunks (with v chunks per rank, a chunk's
forward costs T_F/v; I, W, B likewise: costs.py). So interleaved 1F1B at p=4, m=8, v=2 and unit
costs takes 28.5 (docs/formulas.md), against 33 for 1F1B, with the same object.

    from pipelab import compare
    compare.simulate_named("interleaved-1f1b", 4, 8, pl.Costs(), chunks=2).makespan  # 28.5
    compare.crossover_comm(4, 8, chunks=4)          # where interleaving stops paying
    table = compare.schedule_table(4, 8)            # bubble, peak memory, latency of every schedule
    compare.plot_schedule_table(table)              # draws the table, computes nothing
    check = compare.gain_check(base_run, zb_run)    # predicted vs replayed vs measured saving

Data first, drawing second: the `plot_` functions only draw what the table functions return,
so a notebook asserts on exactly the numbers it shows.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from statistics import median
from typing import Sequence

from ..schedules import SCHEDULES, comm_plan, schedule
from ..schedules.routes import weight_share
from .costs import Costs
from .simulate import simulate
from .timeline import Timeline


# --- the same model, any schedule ---------------------------------------------------------------

def chunk_costs(rank_costs: Costs, sched) -> Costs:
    """The per-stage table `simulate` runs `sched` on, from a rank's worth of layers
    (`Costs.for_schedule`, which states the rule): what one chunk costs, to show it."""
    if not isinstance(rank_costs, Costs):
        raise ValueError(f"rank_costs must be a pl.Costs, got {type(rank_costs).__name__}")
    if rank_costs.scope != "rank":
        raise ValueError("rank_costs must be a rank's worth of layers (pl.Costs(...)), "
                         "not a per-stage table (pl.Costs.per_stage(...))")
    return rank_costs.for_schedule(sched)


def simulate_named(name: str, ranks: int, microbatches: int, rank_costs: Costs | None = None,
                   *, i_frees: float = 0.0, **options) -> Timeline:
    """Build the named schedule and simulate it: costs per rank's worth of layers (default
    F = I = W = 1), which `simulate` divides among the rank's chunks."""
    sched = schedule(name, ranks=ranks, microbatches=microbatches, **options)
    return simulate(sched, rank_costs or Costs(), i_frees=i_frees)


def spans(timeline: Timeline) -> dict[int, float]:
    """Each rank's span, first start to last end: the zero-bubble papers' "makespan" per stage."""
    out = {}
    for r in range(timeline.ranks):
        events = timeline.events_of(r)
        out[r] = (max(e.end for e in events) - min(e.start for e in events)) if events else 0.0
    return out


def longest_span(timeline: Timeline) -> float:
    """The longest per-rank span (convention of the zero-bubble papers; wall-clock is `makespan`)."""
    return max(spans(timeline).values(), default=0.0)


# --- GPipe and 1F1B: closed forms and latency sweeps --------------------------------------------

def gpipe_makespan(stage_times: Sequence[float], microbatches: int) -> float:
    """GPipe's step without communication, from each stage's forward + backward time for one
    microbatch: the first microbatch crosses every stage, the other m − 1 follow at the pace
    of the slowest one, Σ t_s + (m − 1) max t_s ((m + p − 1) t when balanced)."""
    if not stage_times:
        raise ValueError("gpipe_makespan needs at least one stage")
    return sum(stage_times) + (microbatches - 1) * max(stage_times)


def latency_sweep(ranks: int, microbatches: int, latencies: Sequence[float],
                  names: Sequence[str] = ("gpipe", "1f1b"), backward_ratio: float = 2.0,
                  **options) -> list[dict]:
    """Simulated makespans as the message latency grows: one row per latency c,
    {"c": c, name: makespan, ...}, with F = 1 and a full backward of `backward_ratio` (I = W)."""
    half = backward_ratio / 2
    return [{"c": c, **{name: simulate_named(name, ranks, microbatches,
                                             Costs(F=1.0, I=half, W=half, comm=c),
                                             **options).makespan for name in names}}
            for c in latencies]


# --- interleaving: bubble / v against messages × v ---------------------------------------------

def messages(sched) -> int:
    """Cross-rank transfers of one step (activations forward, gradients back)."""
    return sum(len(step.send) for steps in comm_plan(sched) for step in steps)


def interleaving_gain(ranks: int, microbatches: int, chunks: int, comm: float = 0.0,
                      rank_costs: Costs | None = None) -> dict:
    """1F1B against interleaved 1F1B with `chunks` per rank, both at communication cost `comm`:
    makespans, messages per step, and the saving (positive: interleaving is faster)."""
    base = rank_costs or Costs()
    costs = Costs(F=base.F, I=base.I, W=base.W, B=base.B, comm=comm, unit=base.unit,
                  per=base.per, scope=base.scope)
    plain = schedule("1f1b", ranks=ranks, microbatches=microbatches)
    inter = schedule("interleaved-1f1b", ranks=ranks, microbatches=microbatches, chunks=chunks)
    t_plain = simulate(plain, costs).makespan
    t_inter = simulate(inter, costs).makespan
    return {"comm": comm, "chunks": chunks, "1f1b": t_plain, "interleaved": t_inter,
            "saving": t_plain - t_inter,
            "messages_1f1b": messages(plain), "messages_interleaved": messages(inter)}


def comm_sweep(ranks: int, microbatches: int, chunks: Sequence[int], comms: Sequence[float],
               rank_costs: Costs | None = None) -> list[dict]:
    """`interleaving_gain` for every v in `chunks` and c in `comms`: one row each (a table)."""
    return [interleaving_gain(ranks, microbatches, v, c, rank_costs) for v in chunks for c in comms]


def crossover_comm(ranks: int, microbatches: int, chunks: int, rank_costs: Costs | None = None,
                   *, upper: float | None = None, tol: float = 1e-6) -> float | None:
    """The smallest communication cost c at which interleaving (v = `chunks`) is no longer
    faster than 1F1B: simulated makespans equal. None if it stays faster up to `upper`
    (default: 4 × a rank's forward + backward).

    The gap is scanned on a grid first (it need not be monotone for small c), then the first
    interval where interleaving stops winning is bisected.
    """
    base = rank_costs or Costs()
    if upper is None:
        one = base.of("F", 0) + base.of("I", 0) + base.of("W", 0)
        upper = 4.0 * one

    def saving(c: float) -> float:
        return interleaving_gain(ranks, microbatches, chunks, c, base)["saving"]

    if saving(0.0) <= 0:
        return 0.0
    grid = [upper * k / 64 for k in range(65)]
    lo = 0.0
    for c in grid[1:]:
        if saving(c) <= 0:
            hi = c
            break
        lo = c
    else:
        return None
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if saving(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


# --- every registered schedule: bubble against peak memory --------------------------------------

def _options(name: str, chunks: int) -> dict:
    import inspect
    takes = inspect.signature(SCHEDULES[name]).parameters
    return {"chunks": chunks} if "chunks" in takes else {}


def schedule_table(ranks: int, microbatches: int, rank_costs: Costs | None = None, *,
                   names: Sequence[str] | None = None, chunks: int = 2,
                   i_frees: float = 0.0) -> list[dict]:
    """The schedule summary table that the notebooks extend chapter by chapter: one row per
    schedule (default: every registered one) for the same model, with

    - `makespan` (wall-clock) and `span` (the longest per-rank span);
    - `bubble`: idle share of the makespan;
    - `peaks`: peak activations per rank, `peak` the largest, `peak_first` rank 0's (units of
      one microbatch's activations for a rank's worth of layers);
    - `weights`: the weights the busiest rank holds, in units of a rank's worth of the model
      (2 where every stage has a weight replica: DualPipe, Chimera);
    - `per_latency`: makespan per unit of message latency, how much longer the step gets when
      every message costs one more unit (makespan at comm + 1 minus makespan at comm): the
      number of messages on the critical path.

    A schedule that refuses these (p, m) gets a row with `error` set and no numbers."""
    import dataclasses
    base = rank_costs or Costs()
    slower = dataclasses.replace(base, comm=base.comm + 1.0)
    rows = []
    for name in (names or sorted(SCHEDULES)):
        opts = _options(name, chunks)
        row = {"name": name, "chunks": opts.get("chunks", 1)}
        try:
            tl = simulate_named(name, ranks, microbatches, base, i_frees=i_frees, **opts)
        except ValueError as error:
            row.update(error=str(error))
            rows.append(row)
            continue
        slow = simulate_named(name, ranks, microbatches, slower, i_frees=i_frees, **opts)
        peaks = tl.peak_activations()
        row.update(chunks=tl.schedule.chunks, makespan=tl.makespan, span=longest_span(tl),
                   bubble=tl.bubble_fraction(), peaks=[peaks[r] for r in range(tl.ranks)],
                   peak=max(peaks.values()), peak_first=peaks[0],
                   weights=max(weight_share(tl.schedule).values()),
                   per_latency=slow.makespan - tl.makespan, error=None)
        rows.append(row)
    return rows


REFUSAL_CUT = 60        # characters of a refusal a table row keeps


def format_table(rows: list[dict], *, per_rank: bool = False) -> str:
    """`schedule_table` rows as aligned text; `per_rank` adds every rank's peak activations."""
    lines = [f"{'schedule':<18}{'v':>3}{'makespan':>10}{'span':>8}{'bubble':>9}{'peak':>7}"
             f"{'rank 0':>8}{'weights':>8}{'per c':>7}" + ("   peak per rank" if per_rank else "")]
    for r in rows:
        if r.get("error"):
            # Cut between words (a message of several lines becomes one).
            reason = textwrap.shorten(str(r["error"]), REFUSAL_CUT, placeholder=" …")
            lines.append(f"{r['name']:<18}{r['chunks']:>3}   (refused: {reason})")
            continue
        lines.append(f"{r['name']:<18}{r['chunks']:>3}{r['makespan']:>10.4g}{r['span']:>8.4g}"
                     f"{r['bubble']:>9.1%}{r['peak']:>7.3g}{r['peak_first']:>8.3g}"
                     f"{r['weights']:>7.3g}×{r['per_latency']:>7.4g}"
                     + ("   " + " ".join(f"{v:g}" for v in r["peaks"]) if per_rank else ""))
    return "\n".join(lines)


# --- live runs: the saving the simulator predicts from measured costs ---------------------------

def fit_costs(*runs) -> Costs:
    """One cost table from the measured timelines of several runs of the same model and
    partition: the median CPU time of each kind on each stage over all of them (so F comes
    from every run, B from the runs with full backwards, I and W from the split ones), and
    the median message latency as `comm`."""
    if not runs:
        raise ValueError("fit_costs needs at least one run")
    stages = {r.schedule.stages for r in runs}
    if len(stages) != 1:
        raise ValueError(f"runs split the model differently (stages {sorted(stages)})")
    events = [e for r in runs for e in r.timeline.events]
    merged = Timeline(events, runs[0].schedule.ranks, source="measured", time_unit="s")
    comm = median(r.comm_latency for r in runs)
    return Costs.fit(merged, stages.pop(), comm=comm)


@dataclass
class GainCheck:
    """How much shorter `new`'s step is than `base`'s: predicted by the simulator from the
    fitted costs, replayed from each run's per-action CPU times, and measured (wall-clock).

    `predicted`, `replayed`, `measured`: {"base": makespan, "new": makespan} (the medians over
    the rounds for the live ones). `savings`: {"predicted"|"replayed"|"measured": seconds}; for
    live runs given round by round, the median of the per-round differences, so that a slow
    spell of the machine, which hits both runs of a round, cancels out."""
    costs: Costs
    predicted: dict
    replayed: dict
    measured: dict
    savings: dict

    @property
    def predicted_saving(self) -> float:
        return self.savings["predicted"]

    @property
    def replayed_saving(self) -> float:
        return self.savings["replayed"]

    @property
    def measured_saving(self) -> float:
        return self.savings["measured"]

    def error(self, which: str) -> float:
        """|saving(which) − predicted saving| / predicted saving; which: replayed or measured."""
        got = {"replayed": self.replayed_saving, "measured": self.measured_saving}[which]
        return abs(got - self.predicted_saving) / abs(self.predicted_saving) \
            if self.predicted_saving else math.inf

    def share(self, which: str) -> float:
        """The saving as a share of the base step: predicted, replayed or measured. A machine
        that stretches every action alike (other work on the cores) leaves it unchanged."""
        step = {"predicted": self.predicted, "replayed": self.replayed,
                "measured": self.measured}[which]["base"]
        return self.savings[which] / step

    def table(self, base: str = "base", new: str = "new") -> str:
        rows = [("simulated (fitted costs)", self.predicted, "predicted"),
                ("replayed", self.replayed, "replayed"), ("measured", self.measured, "measured")]
        lines = [f"{'':26}{base:>10}{new:>10}{'saving':>10}{'share':>8}{'vs predicted':>14}"]
        for label, d, key in rows:
            saving = self.savings[key]
            vs = "" if key == "predicted" else \
                f"{(saving - self.predicted_saving) / self.predicted_saving:+.1%}"
            lines.append(f"{label:26}{d['base'] * 1e3:>8.2f}ms{d['new'] * 1e3:>8.2f}ms"
                         f"{saving * 1e3:>8.2f}ms{saving / d['base']:>8.1%}{vs:>14}")
        return "\n".join(lines)


def gain_check(base_run, new_run, costs: Costs | None = None) -> GainCheck:
    """Compare live runs of the same model (e.g. 1F1B and ZB-H1): the saving the simulator
    predicts from the runs' own measured costs against the replayed and measured savings.

    Each argument is a RunResult or a list of them, one per round (as
    `live_compare(...).runs[name]` gives them). With equal lists, round k's prediction uses
    costs fitted on round k's two runs (`fit_costs`), and every saving is the median of the
    per-round differences: a slow spell of the machine stretches both runs of a round and the
    costs fitted on them alike. `costs` (default: fitted on all the runs) is the table shown,
    and the one used when the lists cannot be paired."""
    base_runs = list(base_run) if isinstance(base_run, (list, tuple)) else [base_run]
    new_runs = list(new_run) if isinstance(new_run, (list, tuple)) else [new_run]
    paired = len(base_runs) == len(new_runs)
    costs = costs or fit_costs(*base_runs, *new_runs)
    base_sched, new_sched = base_runs[0].schedule, new_runs[0].schedule

    def predict(table: Costs) -> tuple[float, float]:
        return simulate(base_sched, table).makespan, simulate(new_sched, table).makespan

    if paired:
        rounds = [predict(fit_costs(b, n)) for b, n in zip(base_runs, new_runs)]
        predicted = {"base": median(b for b, _ in rounds), "new": median(n for _, n in rounds)}
        savings = {"predicted": median(b - n for b, n in rounds)}
    else:
        b, n = predict(costs)
        predicted, savings = {"base": b, "new": n}, {"predicted": b - n}
    views = {"replayed": lambda r: r.replay.makespan, "measured": lambda r: r.timeline.makespan}
    live = {key: {"base": median(view(r) for r in base_runs),
                  "new": median(view(r) for r in new_runs)} for key, view in views.items()}
    for key, view in views.items():
        if paired:
            savings[key] = median(view(b) - view(n) for b, n in zip(base_runs, new_runs))
        else:
            savings[key] = live[key]["base"] - live[key]["new"]
    return GainCheck(costs, predicted, live["replayed"], live["measured"], savings)
