"""A straggler, live: one process's compute made `factor` times longer, as a hot or slower device.

    slow = pl.with_slowdown(pl.schedule("1f1b", ranks=2, microbatches=4), {1: 1.5})
    res = cluster.run(slow)              # rank 1 takes 1.5× as long over each of its actions

The simulator's side is `pl.Costs(..., slowdown={rank: factor})` (sim/costs.py): every compute
action of that rank costs `factor` times as much. Live, this technique does the same to the
process: after each action's compute it spins (busy work on the CPU, no sleep) for
(factor − 1) × the CPU time the action just took, so the stretch is proportional to each
action, shows on the timeline inside the action's own box, and counts in its CPU time (the
replay charges it too). The numbers, the messages and the gradients are untouched: the run is
exactly as exact as without it.

No keyword of the runtime carries it: `with_slowdown` returns a copy of the schedule that
holds the factors, the technique's prepare hook finds them there (and keeps them on the
schedule the run finally executes, if another technique rebuilt it), and each worker's step
hook brackets its actions through the activation meter's per-action `begin`/`end`, which the
executor calls around every action's compute. Keys are process ranks in the mesh (with one
replica and one shard: the pipeline rank). A braided step (tensor parallelism's overlap) does
not go through that bracket and is not stretched.
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from typing import Mapping

from ..runtime.techniques import Technique, register_technique
from ..schedules.base import Schedule
from ..sim.costs import check_slowdown

_ATTRIBUTE = "slowdown"


def with_slowdown(schedule: Schedule, slowdown: Mapping[int, float]) -> Schedule:
    """A copy of `schedule` whose run makes each listed process `factor` times slower
    ({rank: factor}, factors >= 1; ValueError otherwise). The schedule itself is unchanged."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a pl.Schedule, got {type(schedule).__name__}")
    factors = check_slowdown(slowdown, "slowdown")
    late = [r for r in factors if r >= schedule.ranks]
    if late:
        raise ValueError(f"slowdown names rank {late[0]}, but schedule {schedule.name!r} has "
                         f"ranks 0..{schedule.ranks - 1}")
    out = copy.copy(schedule)
    setattr(out, _ATTRIBUTE, factors)       # pickled with the schedule to every worker
    return out


def slowdown_of(schedule) -> dict[int, float]:
    """The {process rank: factor} a schedule carries ({} for an ordinary one)."""
    return dict(getattr(schedule, _ATTRIBUTE, None) or {})


def _prepare(draft) -> bool:
    factors = slowdown_of(draft.schedule)
    if not factors:
        return False
    late = [r for r in factors if r >= draft.ranks]
    if late:
        raise ValueError(f"slowdown names process {late[0]}, but the run has processes "
                         f"0..{draft.ranks - 1}")

    def keep(d) -> None:                    # a technique may have rebuilt the schedule
        if slowdown_of(d.schedule) != factors:
            d.schedule = copy.copy(d.schedule)
            setattr(d.schedule, _ATTRIBUTE, factors)
    draft.later(keep)
    return True


def _setup(run) -> None:
    run.report["slowdown"] = slowdown_of(run.spec.schedule).get(run.rank, 1.0)


@contextmanager
def _step(run, state):
    factor = run.report.get("slowdown", 1.0)
    if factor > 1.0:
        _stretch(state.meter, factor - 1.0)
    yield


def _stretch(meter, extra: float) -> None:
    """Wrap this step's meter's per-action bracket: at each action's end, spin for `extra` ×
    the CPU time the action took since its begin."""
    begin, end = meter.begin, meter.end
    clock = time.thread_time
    started = [0.0]

    def timed_begin(part) -> None:
        started[0] = clock()
        begin(part)

    def stretched_end() -> None:
        end()
        now = clock()
        until = now + extra * (now - started[0])
        while clock() < until:              # busy work: a slower device, not an idle one
            pass

    meter.begin, meter.end = timed_begin, stretched_end


def _assemble(assembly) -> None:
    assembly.result.slowdown = {rep["rank"]: rep["slowdown"] for rep in assembly.every
                                if rep.get("slowdown", 1.0) != 1.0}


register_technique(Technique("straggler", prepare=_prepare, setup=_setup, step=_step,
                             assemble=_assemble))
