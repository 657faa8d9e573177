"""Notebook helpers for asynchronous pipelines (chapter 11): weight versions over time, loss per
batch, throughput, and an explorer. Data first, drawing second: each `plot_*` draws exactly what
the function before it returns, so a notebook asserts on the numbers it shows."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..schedules.pipedream import flushed
from ..schedules.updates import UPDATE, version_plan
from ..model.memory import parameter_bytes
from ..views.plots import _time_scale, _with_source, compare
from ..schedules import schedule
from ..views import ui
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..support import noise


def versions_over_time(timeline) -> dict[int, list[tuple[float, int]]]:
    """{stage: [(time, weight versions held from then on)]}: a step function that starts at
    (0, 1) and changes at the end of each update (U), read from the schedule's version plan
    with the timeline's own clock — simulated, replayed or measured alike."""
    sched = timeline.schedule
    after = {u: n for stage_list in version_plan(sched).live_after(sched).values()
             for u, n in stage_list}
    out = {s: [(0.0, 1)] for s in range(sched.stages)}
    for e in sorted(timeline.events, key=lambda e: e.end):
        for part in e.action.parts:
            if part.kind == UPDATE:
                out[part.stage].append((e.end, after[part]))
    return out


def weight_bytes(schedule, cfg, bounds) -> dict[int, int]:
    """Predicted peak bytes of weights per rank: each stage's most versions at once (the
    schedule's version plan) × its parameter bytes (the byte model, memory.py)."""
    most = version_plan(schedule).max_versions(schedule)
    out: dict[int, int] = {}
    for stage, n in most.items():
        rank = schedule.rank_of(stage)
        out[rank] = out.get(rank, 0) + n * parameter_bytes(cfg, *bounds[stage])
    return out


def plot_versions(timelines: Sequence, titles: Sequence[str]):
    """Weight versions per stage over time, one panel per timeline, shared axes; each title says
    where its clock comes from (simulated / replayed / measured)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(timelines), 1, figsize=(10, 1.9 * len(timelines) + 0.6),
                             sharex=True, sharey=True, squeeze=False)
    for tl, title, ax in zip(timelines, titles, axes[:, 0]):
        scale, unit = _time_scale(tl)
        for stage, steps in versions_over_time(tl).items():
            times = [t * scale for t, _n in steps] + [tl.makespan * scale]
            counts = [n for _t, n in steps] + [steps[-1][1]]
            ax.step(times, counts, where="post", label=f"stage {stage}", linewidth=1.6)
        ax.set_title(_with_source(title, tl.source), fontsize=10)
        ax.set_ylabel("versions")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[0, 0].set_ylim(0, None)
    fig.subplots_adjust(left=0.08, right=0.85, hspace=0.55, top=0.9, bottom=0.12)
    return fig


def batch_losses(run, per: int) -> list[float]:
    """The run's per-microbatch losses (each at the versions its forward used), as the mean over
    consecutive groups of `per` microbatches: one point per batch of `per`."""
    losses = run.losses
    return [sum(losses[i:i + per]) / per for i in range(0, len(losses) - per + 1, per)]


def plot_losses(curves: Mapping[str, Sequence[float]], samples_per_point: int, title: str):
    """Loss curves against samples seen, one line per schedule, on one axis."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for name, losses in curves.items():
        ax.plot([(i + 1) * samples_per_point for i in range(len(losses))], losses,
                marker="o", markersize=3, label=name)
    ax.set_xlabel("samples seen")
    ax.set_ylabel("mean loss of the batch")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.15, top=0.9)
    return fig


def throughput(run) -> dict[str, float]:
    """Samples per second of one run: measured (wall clock) and replayed (per-action CPU
    times, what p dedicated cores would show)."""
    samples = run.spec.batch_size
    return {"measured": samples / run.timeline.makespan, "replayed": samples / run.replay.makespan}


def training_schedules(ranks: int, batches: int, per: int, twins: bool = False) -> dict:
    """Ways to train on `batches` × `per` microbatches: 1F1B with a flush before each update of
    `per` microbatches, PipeDream (an update per microbatch, no flush), 2BW (an update per `per`
    microbatches, no flush). `twins=True` adds PipeDream's synchronous twin, "1f1b, m=1": the
    same updates, each after a flush."""
    total = batches * per
    out = {"1f1b": flushed(_schedule("1f1b", ranks, per), batches).validate(),
           "pipedream": _schedule("pipedream", ranks, total),
           "pipedream-2bw": _schedule("pipedream-2bw", ranks, total, per_update=per)}
    if twins:
        out["1f1b, m=1"] = flushed(_schedule("1f1b", ranks, 1), total).validate()
    return out


def _schedule(name, ranks, microbatches, **options):
    return schedule(name, ranks=ranks, microbatches=microbatches, **options)


def async_explorer(ranks: int = 4, per: int = 4, batches: int = 3):
    """Sliders: ranks, microbatches per update, batches. Out: the flushed 1F1B, PipeDream and
    2BW timelines (simulated, unit costs) and each stage's weight versions over time."""
    import matplotlib.pyplot as plt
    controls = {"ranks": ui.slider("int", "ranks (p)", value=ranks, min=2, max=6),
                "per": ui.slider("int", "microbatches per update (m)", value=per, min=2, max=8),
                "batches": ui.slider("int", "batches", value=batches, min=2, max=5)}

    def draw(ranks: int, per: int, batches: int) -> None:
        if per < ranks:
            print(f"2BW needs m ≥ p (here m = {per} < p = {ranks}): the update of batch b "
                  f"must be made before batch b+2 enters, or two versions are not enough.")
            return
        scheds = training_schedules(ranks, batches, per)
        tls = [simulate(s, Costs(F=1, I=1, W=1)) for s in scheds.values()]
        names = list(scheds)
        print("  ".join(f"{n}: makespan {tl.makespan:g}, versions per stage "
                        f"{list(version_plan(s).max_versions(s).values())}"
                        for n, s, tl in zip(names, scheds.values(), tls)))
        compare(tls, titles=[f"{n}, p={ranks}, {batches}×{per} microbatches" for n in names])
        plt.show()
        plot_versions(tls[1:], titles=[f"{n}: weight versions per stage" for n in names[1:]])
        plt.show()

    return ui.slider_box(controls, draw, min_height="900px")


def race(cluster, a, b, labels: tuple[str, str], rounds: int = 5, margin: float = 0.05,
         **run_options):
    """Run schedules `a` and `b` live in alternating paired rounds (`pipelab.support.noise`) and judge
    their steps twice: on the wall clock, and replayed from the same runs' CPU times (a win
    must clear 1 ± `margin` in every counted round). Returns (measured verdict, replayed
    verdict); `run_options` go to `cluster.run`."""
    replayed: dict[str, list[float]] = {labels[0]: [], labels[1]: []}

    def timed(label: str, schedule):
        def once() -> float:
            res = cluster.run(schedule, check=False, **run_options)
            replayed[label].append(res.replay.makespan)
            return res.timeline.makespan
        return once

    wall = noise.paired_rounds(timed(labels[0], a), timed(labels[1], b), rounds=rounds,
                               labels=labels, margin=margin)
    return wall, noise.verdict(replayed[labels[0]], replayed[labels[1]], labels, wall.margin,
                               wall.load)
