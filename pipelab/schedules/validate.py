"""Is a schedule sound? Checks that explain themselves, then a dry run that finds deadlocks.

The dry run executes the schedule the way the runtime does: each rank runs its actions strictly
in order, and an action starts only once the actions it consumes have finished (sends never
block). If no rank can move and some still have work, the schedule deadlocks.
"""
from __future__ import annotations

from collections import defaultdict

from .actions import KINDS, Action
from .gcpause import without_gc


class ScheduleError(ValueError):
    """A schedule that cannot run; the message shows the grid with the bad step marked."""

    def __init__(self, problem: str, schedule=None, mark=()):
        self.problem = problem
        self.mark = list(mark)
        text = problem
        if schedule is not None:
            text += "\n\n" + schedule.grid(mark=self.mark, window=6 if len(schedule) > 400 else None)
        super().__init__(text)


@without_gc
def validate(schedule) -> list[tuple[int, Action, list[Action]]]:
    """Raise ScheduleError if the schedule is unsound; else return a feasible execution order."""
    _check_shape(schedule)
    where = _check_actions(schedule)
    _check_complete(schedule)
    _check_local_order(schedule, where)
    return execution_order(schedule)


def _check_shape(s) -> None:
    if s.ranks < 1:
        raise ScheduleError("a schedule needs at least one rank")
    if s.microbatches < 1:
        raise ScheduleError(f"microbatches must be at least 1, got {s.microbatches}")
    bad = [(st, r) for st, r in enumerate(s.placement) if not 0 <= r < s.ranks]
    if bad:
        raise ScheduleError(f"stage {bad[0][0]} is placed on rank {bad[0][1]}, "
                            f"but there are only {s.ranks} ranks")
    idle = [r for r in range(s.ranks) if not s.stages_of(r)]
    if idle:
        raise ScheduleError(f"rank {idle[0]} owns no stage (placement {list(s.placement)})")


def _check_actions(s) -> dict[Action, tuple[int, int]]:
    """Every action known, in range, on its stage's rank and unique; returns where each runs."""
    seen: dict[Action, tuple[int, int]] = {}
    for rank, acts in enumerate(s.actions):
        own = set(s.stages_of(rank))
        for index, a in enumerate(acts):
            if a.kind in KINDS and a.stage in own and 0 <= a.microbatch < s.microbatches \
                    and a not in seen:
                seen[a] = (rank, index)      # the common case: nothing to explain
                continue
            here = [(rank, index)]
            if a.kind not in KINDS:
                raise ScheduleError(f"{a}: unknown action kind {a.kind!r}", s, here)
            if not 0 <= a.stage < s.stages:
                raise ScheduleError(f"{a} names stage {a.stage}, but stages are 0..{s.stages - 1}", s, here)
            if not 0 <= a.microbatch < s.microbatches:
                raise ScheduleError(f"{a} names microbatch {a.microbatch}, "
                                    f"but microbatches are 0..{s.microbatches - 1}", s, here)
            if a.stage not in own:
                raise ScheduleError(f"{a} is on rank {rank}, but stage {a.stage} lives on rank "
                                    f"{s.placement[a.stage]}", s, here)
            raise ScheduleError(f"{a} appears twice (rank {seen[a][0]} step {seen[a][1]} and "
                                f"rank {rank} step {index})", s, [seen[a], (rank, index)])
    return seen


# Kinds one (stage, microbatch) may run, in any order (duplicates are rejected earlier).
_SOUND = {"FB", "BF", "FIW", "FWI", "IFW", "IWF", "WFI", "WIF"}


def _check_complete(s) -> None:
    kinds: dict[tuple[int, int], str] = defaultdict(str)
    for acts in s.actions:
        for stage, kind, m in acts:
            kinds[(stage, m)] += kind
    for stage in range(s.stages):
        rank = s.placement[stage]
        end = [(rank, len(s.actions[rank]))]
        for m in range(s.microbatches):
            has = kinds.get((stage, m), "")
            if has in _SOUND:
                continue
            has = set(has)
            if "F" not in has:
                raise ScheduleError(f"stage {stage} never runs the forward of microbatch {m} "
                                    f"({stage}F{m} is missing on rank {rank})", s, end)
            if "B" in has and has & {"I", "W"}:
                raise ScheduleError(f"microbatch {m} on stage {stage} has a full backward {stage}B{m} "
                                    f"and a split one ({stage}I{m}/{stage}W{m}); use one or the other", s)
            if not has & {"B", "I"}:
                raise ScheduleError(f"stage {stage} never runs the backward of microbatch {m} "
                                    f"(needs {stage}B{m}, or {stage}I{m} then {stage}W{m}, on rank {rank})",
                                    s, end)
            if ("I" in has) != ("W" in has):
                missing = "W" if "I" in has else "I"
                raise ScheduleError(f"{stage}{missing}{m} is missing: a split backward needs both "
                                    f"{stage}I{m} and {stage}W{m} (on rank {rank})", s, end)


_NEEDS_FIRST = {"B": "F", "I": "F", "W": "I"}


def _check_local_order(s, where: dict[Action, tuple[int, int]]) -> None:
    """Backward after forward and W after I, on the rank that runs both: clearer than a deadlock."""
    for a, (rank, i) in where.items():
        before = _NEEDS_FIRST.get(a.kind)
        if before is None:
            continue
        need = Action(a.stage, before, a.microbatch)
        j = where[need][1]
        if j > i:
            raise ScheduleError(f"rank {rank} runs {a} at step {i}, before {need} at step {j}: "
                                f"{KINDS[a.kind]} needs the {KINDS[before]} first",
                                s, [(rank, i), (rank, j)])


@without_gc
def execution_order(s) -> list[tuple[int, Action, list[Action]]]:
    """(rank, action, its dependencies) in an order a blocking run could take.

    Raises ScheduleError on deadlock. Event-driven: a rank that cannot move parks itself on the
    first missing input and is woken when that input is produced, so the pass is linear.
    """
    s.reindex()
    position = [0] * s.ranks
    done: set[Action] = set()
    waiting: dict[Action, list[int]] = defaultdict(list)
    parked: dict[int, list[Action]] = {}     # dependencies of the action a rank is stuck at
    ready = list(range(s.ranks))
    order = []
    deps_of = s.dependencies
    while ready:
        rank = ready.pop()
        acts = s.actions[rank]
        i, n = position[rank], len(acts)
        while i < n:
            action = acts[i]
            deps = parked.pop(rank, None) or deps_of(action)
            missing = None
            for d in deps:
                if d not in done:
                    missing = d
                    break
            if missing is not None:
                waiting[missing].append(rank)
                parked[rank] = deps
                break
            done.add(action)
            order.append((rank, action, deps))
            i += 1
            woken = waiting.pop(action, None)
            if woken:
                ready.extend(woken)
        position[rank] = i
    stuck = [r for r in range(s.ranks) if position[r] < len(s.actions[r])]
    if stuck:
        raise ScheduleError(_explain_deadlock(s, position, stuck), s,
                            [(r, position[r]) for r in stuck])
    return order


def timed_run(order, placement, duration, comm: float = 0.0):
    """Yield (rank, action, start, end) along an execution order: each rank runs its actions in
    order, and an action starts once its inputs have arrived (+`comm` when they cross ranks).

    The simulator runs this with its cost model; the grid with one step per action."""
    end: dict[Action, float] = {}
    free: dict[int, float] = defaultdict(float)
    for rank, action, deps in order:
        start = free[rank]
        for dep in deps:
            arrival = end[dep] + (comm if placement[dep.stage] != rank else 0.0)
            if arrival > start:
                start = arrival
        finish = start + duration(action)
        end[action] = free[rank] = finish
        yield rank, action, start, finish


def _explain_deadlock(s, position, stuck) -> str:
    where = {a: (r, i) for r, acts in enumerate(s.actions) for i, a in enumerate(acts)}
    done = {a for r, acts in enumerate(s.actions) for a in acts[:position[r]]}
    lines = ["deadlock: no rank can make progress."]
    for rank in stuck:
        action = s.actions[rank][position[rank]]
        missing = next(d for d in s.dependencies(action) if d not in done)
        if missing not in where:
            lines.append(f"rank {rank} cannot run {action}: it needs {missing}, which no rank runs")
            continue
        other, _ = where[missing]
        blocker = s.actions[other][position[other]]
        who = "it" if other == rank else f"rank {other}"
        lines.append(f"rank {rank} waits for {missing} (to run {action}), "
                     f"which {who} only runs after {blocker}")
    return "\n".join(lines)
