"""Is a schedule sound? Checks that explain themselves, then a dry run that finds deadlocks.

Each check reads the kind specs (kinds.py) and the dataflow graph (graph.py), so a kind added
with `register_kind` is validated like the built-in ones. The dry run itself lives in graph.py.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..checks import MAX_ACTIONS, MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES
from .actions import NO_MICROBATCH, Action
from .bulk import Plain, plain_arrays
from .errors import GRID_MAX_RANKS, ScheduleError  # noqa: F401  (pl.ScheduleError, re-exported)
from .gcpause import without_gc
from .graph import edges, execution_order, members_of, timed_run  # noqa: F401 - re-exported
from .kinds import BACKWARD, COMPLETES, FORWARD, INPUT_GRAD, KIND_SPECS, KINDS, WEIGHT_GRAD
from .reductions import REPLICA_SUM
from .routes import replicas, route_of_stage, route_problem


@without_gc
def validate(schedule) -> list:
    """Raise ScheduleError if the schedule is unsound; else return a feasible execution order."""
    _check_shape(schedule)
    plain = plain_arrays(schedule)       # a plain schedule's arrays (bulk.py), or None
    # Routes and replicas always get the explaining checks (the bulk test knows one route).
    if schedule.routes is not None or schedule.slices is not None \
            or not _plainly_sound(schedule, plain):   # something to explain: the checks that say what
        where = _check_actions(schedule)
        _check_complete(schedule)
        _check_compounds(schedule)
        _check_replica_sums(schedule, where)
    try:
        return execution_order(schedule, plain)
    except ScheduleError:
        # A rank that needs its own later action deadlocks; say that plainly instead.
        _check_local_order(schedule, _check_actions(schedule), edges(schedule))
        raise


# Bits of the parts a kind completes (its spec's `completes`), and the sums a sound
# (stage, microbatch) has: a forward and a backward, or a forward and both halves of a split one.
_BIT = {FORWARD: 1, BACKWARD: 2, INPUT_GRAD: 4, WEIGHT_GRAD: 8}
_SOUND_BITS = (1 + 2, 1 + 4 + 8)


def _plainly_sound(s, plain: Plain | None) -> bool:
    """The checks of `_check_actions` and `_check_complete` at once, in bulk with numpy, for
    a plain schedule (`plain`, its arrays: bulk.py): single actions in range on their owners'
    ranks, each once, of per-microbatch kinds without collectives. Then each (stage,
    microbatch) must be complete. False means "look closer": the explaining checks then find
    the first offender."""
    if plain is None:
        return False
    bits = np.array([_BIT.get(KIND_SPECS[k].completes, 0) for k in plain.names])[plain.kind]
    has = np.bincount(plain.stage * s.microbatches + plain.mb, weights=bits,
                      minlength=s.stages * s.microbatches)
    return bool(np.isin(has, _SOUND_BITS).all())


def _check_shape(s) -> None:
    if s.ranks < 1:
        raise ScheduleError("a schedule needs at least one rank")
    if isinstance(s.microbatches, bool) or not isinstance(s.microbatches, int):
        raise ScheduleError(f"microbatches must be an integer, got {s.microbatches!r}")
    if s.microbatches < 1:
        raise ScheduleError(f"microbatches must be at least 1, got {s.microbatches}")
    for what, value, limit in (("ranks", s.ranks, MAX_RANKS), ("stages", s.stages, MAX_STAGES),
                               ("microbatches", s.microbatches, MAX_MICROBATCHES),
                               ("actions", len(s), MAX_ACTIONS)):
        if value > limit:           # no grid: it would be as large as the problem
            raise ScheduleError(f"the schedule has {value:,} {what}, above the limit of "
                                f"{limit:,}")
    bad = [(st, r) for st, r in enumerate(s.placement) if not 0 <= r < s.ranks]
    if bad:
        raise ScheduleError(f"stage {bad[0][0]} is placed on rank {bad[0][1]}, "
                            f"but there are only {s.ranks} ranks")
    owners = set(s.placement)                    # one pass: stages_of per rank is quadratic
    idle = [r for r in range(s.ranks) if r not in owners]
    if idle:
        shown = list(s.placement) if len(s.placement) <= 16 else \
            f"{list(s.placement[:16])[:-1]}, ...] ({len(s.placement)} stages)"
        raise ScheduleError(f"rank {idle[0]} owns no stage (placement {shown})")
    if s.routes is not None or s.slices is not None:
        problem = route_problem(s)
        if problem:
            raise ScheduleError(f"routes: {problem}", s)


def _check_actions(s) -> dict[Action, tuple[int, int]]:
    """Every action known, in range, on a rank that may run it and unique; every member of a
    collective reaches it. Returns where each action runs (its first rank for a collective)."""
    seen: dict[Action, tuple[int, int]] = {}
    collective_seen: dict[Action, dict[int, int]] = defaultdict(dict)
    specs = KIND_SPECS
    m = s.microbatches
    own_by_rank: list[set[int]] = [set() for _ in range(s.ranks)]
    for stage, owner in enumerate(s.placement):  # one pass: stages_of per rank is quadratic
        own_by_rank[owner].add(stage)
    for rank, acts in enumerate(s.actions):
        own = own_by_rank[rank]
        for index, item in enumerate(acts):
            if type(item) is Action:         # the common case first, kept tight
                spec = specs.get(item[1])
                if spec is not None and not spec.collective and item[0] in own \
                        and 0 <= item[2] < m and item not in seen:
                    seen[item] = (rank, index)
                    continue
            for a in ((item,) if type(item) is Action else item):
                spec = specs.get(a[1])
                if spec is not None and not spec.collective and a.stage in own \
                        and 0 <= a.microbatch < m and a not in seen:
                    seen[a] = (rank, index)      # nothing to explain
                    continue
                here = [(rank, index)]
                if spec is None:
                    raise ScheduleError(f"{a}: unknown action kind {a.kind!r}; known kinds: "
                                        f"{', '.join(KINDS)}", s, here)
                if not 0 <= a.stage < s.stages:
                    raise ScheduleError(f"{a} names stage {a.stage}, but stages are "
                                        f"0..{s.stages - 1}", s, here)
                if spec.per_microbatch and not 0 <= a.microbatch < s.microbatches:
                    raise ScheduleError(f"{a} names microbatch {a.microbatch}, "
                                        f"but microbatches are 0..{s.microbatches - 1}", s, here)
                if not spec.per_microbatch and a.microbatch != NO_MICROBATCH:
                    raise ScheduleError(f"{a}: kind {a.kind} ({spec.description}) runs once per "
                                        f"step and takes no microbatch", s, here)
                if spec.collective:
                    members = members_of(s, a)
                    if rank not in members:
                        raise ScheduleError(f"{a} is on rank {rank}, but its collective's members "
                                            f"are ranks {', '.join(map(str, members))}", s, here)
                    if rank in collective_seen[a]:
                        raise ScheduleError(f"{a} appears twice on rank {rank}", s,
                                            [(rank, collective_seen[a][rank]), (rank, index)])
                    collective_seen[a][rank] = index
                    seen.setdefault(a, (rank, index))
                    continue
                if a.stage not in own:
                    raise ScheduleError(f"{a} is on rank {rank}, but stage {a.stage} lives on rank "
                                        f"{s.placement[a.stage]}", s, here)
                if a in seen:
                    raise ScheduleError(f"{a} appears twice (rank {seen[a][0]} step {seen[a][1]} "
                                        f"and rank {rank} step {index})", s, [seen[a], (rank, index)])
                seen[a] = (rank, index)      # a step-wide action (no microbatch): sound
    for a, ranks in collective_seen.items():
        members = members_of(s, a)
        absent = [r for r in members if r not in ranks]
        if absent:
            raise ScheduleError(
                f"rank {absent[0]} never reaches {a} ({KIND_SPECS[a.kind].description}), a "
                f"collective of ranks {', '.join(map(str, members))}: every member must run it",
                s, [(r, i) for r, i in ranks.items()] + [(absent[0], len(s.actions[absent[0]]))])
    return seen


# The same parts counted in base-16 digits, for the explaining check (a kind appears once per
# (stage, microbatch), so a digit counts the distinct kinds that complete that part).
_DIGIT = {FORWARD: 1, BACKWARD: 16, INPUT_GRAD: 256, WEIGHT_GRAD: 4096}
_SOUND_SUMS = (1 + 16, 1 + 256 + 4096)


def _check_complete(s) -> None:
    """Every (stage, microbatch) runs a kind that completes its forward and one that completes
    its backward, or one of each half of a split backward (the kinds' `completes`)."""
    weight = {k: _DIGIT[spec.completes] for k, spec in KIND_SPECS.items() if spec.completes}
    done: dict[tuple[int, int], int] = defaultdict(int)
    for acts in s.actions:
        for item in acts:
            if type(item) is Action:             # the common case, without a loop
                if item[1] in weight:
                    done[(item[0], item[2])] += weight[item[1]]
                continue
            for stage, kind, m in item:
                if kind in weight:
                    done[(stage, m)] += weight[kind]
    routing = _microbatch_routes(s, done)
    for stage in range(s.stages):
        rank = s.placement[stage]
        end = [(rank, len(s.actions[rank]))]
        for m in range(s.microbatches):
            if routing is not None and routing[0][m] != routing[1][stage]:
                continue                 # another route's microbatch: it never comes here
            value = done.get((stage, m), 0)
            if value not in _SOUND_SUMS:
                _explain_incomplete(s, stage, m, {p: value // d % 16 for p, d in _DIGIT.items()},
                                    end)


def _explain_incomplete(s, stage: int, m: int, has: dict[str, int], end) -> None:
    """Raise the ScheduleError that says what (stage, microbatch) `m` lacks or has twice."""
    rank = s.placement[stage]
    twice = [p for p in COMPLETES if has[p] > 1]
    if twice:
        which = [str(part) for acts in s.actions for item in acts for part in item.parts
                 if part[0] == stage and part[2] == m
                 and KIND_SPECS[part[1]].completes == twice[0]]
        raise ScheduleError(f"microbatch {m} on stage {stage} completes its {twice[0]} "
                            f"twice ({' and '.join(which)}); keep one", s)
    f, b, i, w = (_kind_completing(p) for p in COMPLETES)         # named in the messages
    if not has[FORWARD]:
        raise ScheduleError(f"stage {stage} never runs the forward of microbatch {m} "
                            f"({stage}{f}{m} is missing on rank {rank})", s, end)
    if has[BACKWARD] and (has[INPUT_GRAD] or has[WEIGHT_GRAD]):
        raise ScheduleError(f"microbatch {m} on stage {stage} has a full backward {stage}{b}{m} "
                            f"and a split one ({stage}{i}{m}/{stage}{w}{m}); use one or the other", s)
    if not (has[BACKWARD] or has[INPUT_GRAD]):
        raise ScheduleError(f"stage {stage} never runs the backward of microbatch {m} "
                            f"(needs {stage}{b}{m}, or {stage}{i}{m} then {stage}{w}{m}, on rank {rank})",
                            s, end)
    missing = w if has[INPUT_GRAD] else i
    raise ScheduleError(f"{stage}{missing}{m} is missing: a split backward needs both "
                        f"{stage}{i}{m} and {stage}{w}{m} (on rank {rank})", s, end)


def _kind_completing(part: str) -> str:
    """The first registered kind that completes `part` (the built-in one), for messages."""
    return next((k for k, spec in KIND_SPECS.items() if spec.completes == part), f"<{part}>")


def _microbatch_routes(s, kinds: dict) -> tuple[list[int], list[int]] | None:
    """With several routes: (each microbatch's route, each stage's route).
    A microbatch that runs stages of two routes is an error; one that runs none takes route 0
    (and is reported missing there)."""
    if s.routes is None or len(s.routes) == 1:
        return None
    of_stage = route_of_stage(s)
    chosen = [None] * s.microbatches
    for (stage, m) in sorted(kinds):
        route = of_stage[stage]
        if chosen[m] is None:
            chosen[m] = (route, stage)
        elif chosen[m][0] != route:
            raise ScheduleError(f"microbatch {m} runs on stage {chosen[m][1]} (route "
                                f"{chosen[m][0]}) and stage {stage} (route {route}): a "
                                f"microbatch follows one route", s)
    return [0 if c is None else c[0] for c in chosen], of_stage


def _check_compounds(s) -> None:
    """The parts of a compound step run together (overlapped on a GPU): none may consume what
    another part produces, or read state another part leaves (a B its own pair's F)."""
    for rank, acts in enumerate(s.actions):
        for index, item in enumerate(acts):
            if type(item) is Action:
                continue
            for part in item:
                for _name, need, _carries in KIND_SPECS[part.kind].inputs(s, part):
                    if need in item:
                        raise ScheduleError(
                            f"{item} on rank {rank} pairs {part} with {need}, which it needs "
                            f"first: the parts of a compound step run at the same time, so "
                            f"they must be independent", s, [(rank, index)])


def _check_replica_sums(s, where: dict) -> None:
    """Every model part held by two stages (weight replicas) has its gradients summed (a
    `G` action): without it each copy trains on half the batch and the copies drift apart."""
    if s.slices is None:
        return
    for part, stages in replicas(s).items():
        summed = [a for a in where if a[1] == REPLICA_SUM and s.slice_of(a[0]) == part]
        if not summed:
            ranks = sorted({s.placement[st] for st in stages})
            raise ScheduleError(
                f"model part {part} has weight replicas (stages {', '.join(map(str, stages))} "
                f"on ranks {', '.join(map(str, ranks))}) whose gradients are never summed: add "
                f"{stages[0]}{REPLICA_SUM} on each of those ranks, after their last backward",
                s, [(r, len(s.actions[r])) for r in ranks])


def _check_local_order(s, where: dict[Action, tuple[int, int]], graph: dict) -> None:
    """An action that reads state its own rank produces (a backward its forward's, W its I's)
    must come after it in that rank's list: clearer than reporting a deadlock."""
    for a, (rank, i) in where.items():
        for _name, need, carries in graph[a]:
            if carries:
                continue               # data from elsewhere: the dry run judges it
            found = where.get(need)
            if found is None or found[0] != rank or found[1] <= i:
                continue               # missing ones are reported by _check_complete
            j = found[1]
            raise ScheduleError(f"rank {rank} runs {a} at step {i}, before {need} at step {j}: "
                                f"{KINDS[a.kind]} needs the {KINDS[need.kind]} first",
                                s, [(rank, i), (rank, j)])
