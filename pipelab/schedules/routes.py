"""Routes: which stages a microbatch passes through, and which part of the model each computes.

A plain pipeline has one route, stage 0 → 1 → … → S−1, and stage s computes part s of the
model. A bidirectional pipeline (Chimera, DualPipe) has two: microbatches fed from the first
rank go down the ranks, those fed from the last rank go up, and every part of the model is
computed by two stages — one on each route, on different ranks — which are *weight replicas*.
Stages keep distinct numbers (so every action, message and timeline entry still names exactly
one stage); `Schedule.routes` lists each route's stages and `Schedule.slices` maps each stage
to the part it computes. A microbatch's route is the one whose stages run it.
"""
from __future__ import annotations


def _routes(schedule) -> tuple[tuple[int, ...], ...]:
    """The schedule's routes; without any, the one route through every stage."""
    if schedule.routes is not None:
        return schedule.routes
    return (tuple(range(len(schedule.placement))),)


def route_links(schedule) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(previous, next) stage of every stage on its route, -1 at a route's start / end."""
    n = len(schedule.placement)
    routes = _routes(schedule)
    before, after = [-1] * n, [-1] * n
    for route in routes:
        for a, b in zip(route, route[1:]):
            if 0 <= a < n and 0 <= b < n:
                after[a], before[b] = b, a
    return tuple(before), tuple(after)


def route_problem(schedule) -> str | None:
    """Why the schedule's routes and slices cannot describe a training step, or None.

    Rules: the routes cover every stage exactly once; each route computes the whole model,
    part 0 to the last, in order; two stages computing the same part (replicas) live on
    different ranks (one rank holding both would be one stage twice)."""
    n = len(schedule.placement)
    routes = _routes(schedule)
    seen: dict[int, int] = {}
    for number, route in enumerate(routes):
        for stage in route:
            if not 0 <= stage < n:
                return f"route {number} names stage {stage}, but stages are 0..{n - 1}"
            if stage in seen:
                return (f"stage {stage} is on route {seen[stage]} and route {number}: each stage "
                        f"belongs to exactly one route")
            seen[stage] = number
    missing = [s for s in range(n) if s not in seen]
    if missing:
        return f"stage {missing[0]} is on no route: the routes must cover every stage"
    if schedule.slices is not None and len(schedule.slices) != n:
        return f"slices names {len(schedule.slices)} stages, but the schedule has {n}"
    parts = schedule.model_slices
    for number, route in enumerate(routes):
        computed = [schedule.slice_of(s) for s in route]
        if computed != list(range(parts)):
            return (f"route {number} (stages {list(route)}) computes model parts {computed}: a "
                    f"route must compute every part 0..{parts - 1} once, in order")
    holder: dict[tuple[int, int], int] = {}
    for stage, rank in enumerate(schedule.placement):
        key = (schedule.slice_of(stage), rank)
        if key in holder:
            return (f"stages {holder[key]} and {stage} both compute model part {key[0]} on rank "
                    f"{rank}: weight replicas must live on different ranks")
        holder[key] = stage
    return None


def route_of_stage(schedule) -> list[int]:
    """The route number of every stage."""
    n = len(schedule.placement)
    routes = _routes(schedule)
    out = [0] * n
    for number, route in enumerate(routes):
        for stage in route:
            out[stage] = number
    return out


def replicas(schedule) -> dict[int, list[int]]:
    """Model part -> the stages computing it, for the parts held by more than one stage."""
    groups: dict[int, list[int]] = {}
    for stage in range(len(schedule.placement)):
        groups.setdefault(schedule.slice_of(stage), []).append(stage)
    return {part: stages for part, stages in groups.items() if len(stages) > 1}


def weight_share(schedule) -> dict[int, float]:
    """The weights each rank holds, in units of a rank's worth of the model (1/p of it): 1 for
    1F1B, ZB-V and DualPipeV, 2 for DualPipe and Chimera (two parts of p on every rank)."""
    out = {r: 0.0 for r in range(schedule.ranks)}
    for rank in schedule.placement:
        out[rank] += schedule.ranks / schedule.model_slices
    return out


def weight_copies(schedule) -> float:
    """Copies of the whole model's weights the pipeline holds: 2 for DualPipe and Chimera,
    1 for every schedule without replicas (DualPipeV, ZB-V, 1F1B)."""
    return len(schedule.placement) / schedule.model_slices
