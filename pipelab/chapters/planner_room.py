"""What a plan must leave room for (notebook 12): a straggler, and the microbatch size.

A straggler: `pl.Costs(slowdown={rank: factor})` in the simulator, `pl.with_slowdown` live
(techniques/straggler.py); `straggler_rounds` times an even and a slowed run in paired rounds.
The microbatch size: at a fixed global batch, more microbatches shrink the bubble but make each
action a smaller GEMM that pays the calibration's fixed cost once more (calibrate.py: each
layer costs fixed + per row × rows); `microbatch_steps` reads the planner's simulated step for
every m, `closed_form_best` finds the optimum by a formula, `microbatch_explorer` is the slider.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..planner.plan import plan
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..support.noise import Verdict, paired_rounds
from ..techniques.straggler import with_slowdown
from ..views import ui


# --- a straggler -------------------------------------------------------------------------------
@dataclass
class StragglerRounds:
    """Paired rounds of an even run and one with a slowed rank: the verdict on the replayed
    steps, every run (the first even one gives the costs the simulator predicts from)."""
    verdict: Verdict
    even: list
    slowed: list

    def predicted_ratio(self, slowdown: dict) -> float:
        """The simulator's slowed / even step, on the costs fitted from the first even run."""
        first = self.even[0]
        costs = Costs.fit(first.timeline, first.spec.schedule.stages)
        slowed = Costs.fit(first.timeline, first.spec.schedule.stages)
        slowed.slowdown = dict(slowdown)
        sched = first.spec.schedule
        return simulate(sched, slowed).makespan / simulate(sched, costs).makespan

    def wall_ratio(self) -> float:
        """The median of the rounds' measured (wall-clock) slowed / even steps."""
        ratios = sorted(b.timeline.makespan / a.timeline.makespan
                        for a, b in zip(self.even, self.slowed))
        return ratios[len(ratios) // 2]


def straggler_rounds(cluster, schedule, slowdown: dict, rounds: int = 5,
                     margin: float = 0.05, **run) -> StragglerRounds:
    """Run `schedule` even and with `slowdown` (pl.with_slowdown) in alternating rounds; judge
    the replayed steps (each action's CPU time on the schedule: what the load leaves alone)."""
    slow = with_slowdown(schedule, slowdown)
    even, slowed = [], []

    def timer(sched, into):
        def once() -> float:
            res = cluster.run(sched, **run)
            into.append(res)
            return res.replay.makespan
        return once
    verdict = paired_rounds(timer(schedule, even), timer(slow, slowed), rounds=rounds,
                            labels=("even", "straggler"), margin=margin, progress=False)
    return StragglerRounds(verdict, even, slowed)


# --- the microbatch size -----------------------------------------------------------------------
def microbatch_steps(cfg, cal, pipeline: int, batch_size: int, schedule: str = "1f1b") -> dict:
    """{m: the planner's candidate} for `schedule` on `pipeline` devices as one pipeline (no
    replicas, no tensor parallelism, no recomputation), at every m the planner tries (the
    divisors of the batch): what the planner simulates from the calibration."""
    p = plan(cfg, devices=pipeline, memory_per_device=2 ** 40, batch_size=batch_size,
             calibration=cal, schedules=[schedule], recompute=["none"])
    return {c.microbatches: c for c in sorted(p, key=lambda c: c.microbatches)
            if c.pipeline == pipeline and c.data_parallel == 1 and c.tensor == 1
            and not c.vocab}


def stage_lines(cal, bounds) -> list[tuple[float, float]]:
    """Per stage: (fixed seconds, seconds per row) of one microbatch's F + I + W, read from the
    calibration's per-layer lines (and its per-action overhead, three actions)."""
    out = []
    for a, b in bounds:
        fixed = cal.forward_time(a, b, 0) + sum(cal.backward_time(a, b, 0)) + 3 * cal.overhead
        out.append((fixed, cal.forward_time(a, b, 1) + sum(cal.backward_time(a, b, 1))
                    + 3 * cal.overhead - fixed))
    return out


def closed_form_step(lines, m: int, batch_size: int) -> float:
    """(m + p − 1) × the slowest stage's time at batch_size / m rows: the bubble's formula
    with each microbatch costing fixed + per row × rows."""
    rows = batch_size / m
    return (m + len(lines) - 1) * max(a + c * rows for a, c in lines)


def closed_form_best(lines, counts, batch_size: int) -> tuple[int, float]:
    """(the m among `counts` the closed form prefers, the continuous optimum of (m + p − 1)(a +
    c·b/m) for the slowest stage at one row: m* = √((p − 1)·c·b / a))."""
    best = min(counts, key=lambda m: closed_form_step(lines, m, batch_size))
    a, c = max(lines, key=lambda line: line[0] + line[1])
    p = len(lines)
    return best, math.sqrt((p - 1) * c * batch_size / a) if a > 0 else math.inf


def plot_microbatches(steps: dict, lines, batch_size: int, chosen: int | None = None, ax=None):
    """The planner's simulated step against m (log axis), the closed form beside it, the best m
    starred and the chosen one circled."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2))
    ms = list(steps)
    sim = [steps[m].step_time * 1e3 for m in ms]
    ax.plot(ms, sim, "o-", color="tab:blue", label="planner (simulated)")
    ax.plot(ms, [closed_form_step(lines, m, batch_size) * 1e3 for m in ms], "--",
            color="grey", label="(m + p − 1) × slowest stage (closed form)")
    best = min(ms, key=lambda m: steps[m].step_time)
    ax.scatter([best], [steps[best].step_time * 1e3], marker="*", s=260, color="gold",
               edgecolors="black", zorder=5, label=f"best m = {best}")
    if chosen is not None:
        ax.scatter([chosen], [steps[chosen].step_time * 1e3], s=160, facecolors="none",
                   edgecolors="crimson", lw=2, zorder=6, label=f"your m = {chosen}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel(f"microbatches m (a global batch of {batch_size} sequences)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("1F1B step against the microbatch count — simulated from the calibration")
    ax.legend(fontsize=8, loc="upper center")
    ax.grid(alpha=0.3)
    return ax


def describe(steps: dict, m: int, pipeline: int) -> str:
    """One line: the step at m, its bubble share and its fixed-cost count, and the best m."""
    best = min(steps, key=lambda k: steps[k].step_time)
    bubble = (pipeline - 1) / (m + pipeline - 1)
    return (f"m = {m}: step {steps[m].step_time * 1e3:.1f} ms, bubble (p−1)/(m+p−1) = "
            f"{bubble:.0%}, {m + pipeline - 1} microbatch-slots each paying the fixed cost; "
            f"best m = {best} ({steps[best].step_time * 1e3:.1f} ms)")


def microbatch_explorer(cfg, cal, *, pipeline: int = 4, batch_size: int = 32):
    """A slider over m (and the pipeline depth and the global batch): the planner's simulated
    step at every m, the one chosen circled and the best starred."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    controls = {
        "pipeline": ui.control(w.Dropdown, "pipeline ranks p", options=[2, 4, 8],
                               value=pipeline),
        "batch": ui.control(w.Dropdown, "global batch (sequences)", options=[16, 32, 64, 128],
                            value=batch_size),
        "m": ui.slider("int", "microbatches m (log₂)", value=int(math.log2(pipeline)), min=0,
                       max=7),
    }

    def draw(pipeline: int, batch: int, m: int) -> None:
        chosen = min(2 ** m, batch)
        if cfg.total_layers < pipeline:
            print(f"the model has {cfg.total_layers} layers: at most {cfg.total_layers} ranks")
            return
        steps = microbatch_steps(cfg, cal, pipeline, batch)
        bounds = next(iter(steps.values())).bounds
        plot_microbatches(steps, stage_lines(cal, bounds), batch, chosen)
        plt.show()
        print(describe(steps, chosen, pipeline))

    return ui.slider_box(controls, draw, min_height="420px")
