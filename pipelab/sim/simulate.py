"""Simulate a schedule on a cost model: an event simulation of its dependency graph.

Each rank runs its actions in order; an action starts when its rank is free and every input has
arrived, plus `comm` when the input crosses ranks. Closed forms only hold for balanced stages
and zero communication; this always holds.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import repeat
from operator import itemgetter

import numpy as np

from .costs import Costs     # the cost model (costs.py); imported from here too
from ..schedules.actions import Action
from ..schedules.gcpause import without_gc
from ..schedules.graph import step_times, times_in_waves
from ..schedules.kinds import KIND_SPECS, unit_effects
from .shape import check_vocabulary_costs
from .timeline import Event, Timeline
from .tensor_overlap import TP_REDUCE, data_edge, step_time

_new = tuple.__new__     # builds an Event without the named tuple's slower constructor


@without_gc
def simulate(schedule, costs: Costs | None = None, *, i_frees: float = 0.0,
             source: str = "simulated") -> Timeline:
    """Run the schedule on the cost model: a `pl.Costs` is a rank's worth of layers, divided
    over the schedule's stages; `pl.Costs.per_stage(...)` is used as given (costs.py).
    `i_frees` is the share of a forward's activations that an input-gradient pass I releases
    (W releases the rest; a full B releases all)."""
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise ValueError(f"costs must be a pl.Costs (e.g. pl.Costs(F=1, I=1, W=1)), "
                         f"got {type(costs).__name__}")
    if not hasattr(schedule, "execution_order"):
        raise ValueError(f"schedule must be a pl.Schedule, got {type(schedule).__name__}")
    if not 0.0 <= i_frees <= 1.0:
        raise ValueError(f"i_frees must be between 0 and 1, got {i_frees}")
    check_vocabulary_costs(schedule, costs)   # a vocabulary schedule needs its passes costed
    order = schedule.execution_order()     # validates (once per unchanged schedule)
    costs = costs.for_schedule(schedule)   # a rank's worth divided over the stages (costs.py)
    if costs.replicas is None and getattr(schedule, "data_parallel", 1) > 1:
        costs = replace(costs, replicas=schedule.data_parallel)
    names = list(KIND_SPECS)                # kinds by number, for the bulk (numpy) steps
    plain = _plain_steps(order, names)
    comm = costs.message_time()
    waves = order.waves is not None and not costs.tensor_parallel and plain is not None
    if waves:                                # ordered in bulk (graph.py): timed in bulk
        spans = None
        starts, ends = times_in_waves(order, _durations(costs, order, plain, names,
                                                        schedule.microbatches), comm)
    elif costs.tensor_parallel:           # all-reduces in the steps: exposed, hidden or a tail
        took, tails, spans = _tp_timing(costs, order, schedule.microbatches)
        starts, ends = step_times(order, took, comm,
                                  tail=tails if costs.tp_sends_wait else None,
                                  data_edge=lambda step, before: data_edge(schedule, step, before))
    else:
        spans = None
        starts, ends = step_times(order, _durations(costs, order, plain, names,
                                                    schedule.microbatches).tolist(), comm)
    if waves:                                # events made in the timeline's order, in bulk
        rank, kind, _stage = plain
        by_time = np.lexsort((rank, starts))          # the order Timeline sorts its events in
        events = list(map(_new, repeat(Event), zip(
            rank[by_time].tolist(), map(order.waves.flat.__getitem__,
                                        order.waves.row[by_time].tolist()),
            starts[by_time].tolist(), ends[by_time].tolist(), repeat(None))))
        rows = rank, kind, starts, ends
    elif plain is not None:                  # one event per step, built in bulk
        rank, kind, _stage = plain
        events = list(map(_new, repeat(Event), zip(rank.tolist(), order.steps, starts, ends,
                                                   repeat(None))))
        rows = rank, kind, np.array(starts), np.array(ends)
    else:                                    # a collective's step: one event on each rank
        events = [_new(Event, (rank, item, start, end, None))
                  for ranks, item, start, end in zip(order.ranks, order.steps, starts, ends)
                  for rank in ranks]
        code = {kind: i for i, kind in enumerate(names)}
        rows = np.array([(e[0], code[part[1]], e[2], e[3]) for e in events
                         for part in e[1].parts]).reshape(-1, 4).T
    # Share of one forward's activations each kind adds (+) or releases (−): the kind specs'
    # byte rules, a split backward's halves sharing a forward's as `i_frees` says.
    effect = unit_effects(i_frees)
    stages_on = [0] * schedule.ranks
    for owner in schedule.placement:
        stages_on[owner] += 1
    # A weight replica's stage is a whole part of the model (routes.py): a rank of v stages
    # holding S parts' worth out of `stages` counts each forward as stages/S of 1/v.
    stages_on = [v * schedule.model_slices / schedule.stages for v in stages_on]
    memory = _curves(*rows, np.array([effect.get(k, 0.0) for k in names]), stages_on)
    if spans is not None:                 # the all-reduces, on the ranks' communication lanes
        events += [_new(Event, (ranks[0], Action(part[0], TP_REDUCE, part[2]), start + a,
                                start + b, None))
                   for ranks, start, step_spans in zip(order.ranks, starts, spans)
                   for a, b, part in step_spans]
    title = schedule.name + (f" (fixed batch, m={schedule.microbatches})"
                             if costs.per == "batch" else "")
    return Timeline(events, schedule.ranks, source=source, memory=memory,
                    memory_unit="microbatch-stages", title=title, time_unit=costs.unit,
                    schedule=schedule, comm=comm, presorted=waves)


def _plain_steps(order, names: list[str]) -> tuple[np.ndarray, ...] | None:
    """(rank, kind, stage) of every step of the order as arrays (a kind as its index in
    `names`), when each step is one action on one rank; None when there are compounds or
    collectives, which are then read step by step."""
    bulk = order.waves
    if bulk is not None and list(bulk.names) == names:     # kept by the bulk order already
        return bulk.rank, bulk.kind, bulk.stage
    code = {kind: i for i, kind in enumerate(names)}
    n = len(order)
    kind = np.fromiter(map(code.get, map(itemgetter(1), order.steps), repeat(-1)), np.int64, n)
    if (kind < 0).any() or max(map(len, order.ranks), default=1) > 1:
        return None                          # a compound's [1] is an action, not a kind
    rank = np.fromiter(map(itemgetter(0), order.ranks), np.int64, n)
    stage = np.fromiter(map(itemgetter(0), order.steps), np.int64, n)
    return rank, kind, stage


def _durations(costs: Costs, order, plain, names: list[str], microbatches: int) -> np.ndarray:
    """The time of each step of an execution order, by position: one cost per (kind, stage),
    looked up in bulk for plain steps, step by step for compounds or measured times."""
    if costs.per_action or plain is None:
        return np.array(list(map(_cached_durations(costs, microbatches), order.steps)), float)
    _rank, kind, stage = plain
    table = np.zeros((len(names), stage.max() + 1))
    for k in np.flatnonzero(np.bincount(kind)).tolist():
        table[k] = [costs.duration(_new(Action, (s, names[k], 0)), microbatches)
                    for s in range(table.shape[1])]
    return table[kind, stage]


def _tp_timing(costs: Costs, order, microbatches: int) -> tuple[list, list, list]:
    """Per step, by position: compute time, tail and all-reduce spans under tensor parallelism
    (tensor_overlap.py), computed once per shape of step; a measured step keeps its own time."""
    measured = costs.per_action or {}
    cache: dict = {}
    took, tails, spans = [], [], []
    for item in order.steps:
        if item in measured and not costs.link:
            took.append(measured[item])
            tails.append(0.0)
            spans.append(())
            continue
        if item in measured:          # a replay on a link: the measured compute, and the
            busy, tail, shape = step_time(costs, item, microbatches)   # link's all-reduces
            extra = measured[item] - sum(costs.duration(p, microbatches) for p in item.parts)
            took.append(busy + extra)
            tails.append(tail)
            spans.append([(a, b, item.parts[i]) for a, b, i in shape])
            continue
        key = tuple((part[0], part[1]) for part in item.parts)
        if key not in cache:
            cache[key] = step_time(costs, item, microbatches)
        busy, tail, shape = cache[key]
        took.append(busy)
        tails.append(tail)
        spans.append([(a, b, item.parts[i]) for a, b, i in shape])
    return took, tails, spans


def _cached_durations(costs: Costs, microbatches: int = 1):
    """`costs.duration`, computed once per (kind, stage) unless measured per action."""
    measured = costs.per_action or {}
    model_cost: dict[tuple[str, int], float] = {}

    def duration(action: Action) -> float:
        if measured and action in measured:
            return measured[action]
        key = (action[1], action[0]) if type(action) is Action else action
        if key not in model_cost:
            model_cost[key] = costs.duration(action, microbatches)
        return model_cost[key]
    return duration


def _curves(rank: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray,
            effect: np.ndarray, stages_on: list[int]) -> dict[int, list[tuple[float, float]]]:
    """Step curves of live activations per rank, from one row per action run (in the order
    they ran), in units of one stage's forward (a rank with v stages holds 1/v of its
    activations per stage-forward). `effect[kind]` is what a kind allocates (+, at its start)
    or frees (−, at its end). Changes at the same instant are merged (a free and an allocation
    at one moment do not dip to the lower level and back); levels are rounded to 12 digits, so
    what was allocated and freed again reads exactly 0."""
    change = effect[kind.astype(np.int64)]
    keep = change != 0
    rank, change = rank[keep], change[keep]
    when = np.where(change > 0, start[keep], end[keep])
    by_rank = np.argsort(rank, kind="stable")        # each rank's changes, still in time order
    bounds = np.searchsorted(rank[by_rank], np.arange(len(stages_on) + 1))
    curves = {}
    for r, stages in enumerate(stages_on):
        mine = by_rank[bounds[r]:bounds[r + 1]]
        t = np.concatenate(([0.0], when[mine]))
        level = np.round(np.concatenate(([0.0], np.cumsum(change[mine]))) / stages, 12)
        last = np.append(t[1:] != t[:-1], True)     # the last change at each instant
        curves[r] = list(zip(t[last].tolist(), level[last].tolist()))
    return curves
