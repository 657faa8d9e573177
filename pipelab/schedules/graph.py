"""The dataflow graph of a schedule: what each action consumes, and an order in which it can run.

Built from the kind specs (kinds.py). Everything that needs to know how actions depend on each
other reads it: the validator (local order, deadlock), the communication plan (which edges
become messages), the simulator and the grid (`timed_run`), the runtime (what a handler
receives) and the watchdog.

The dry run executes the schedule the way the runtime does: each rank runs its steps strictly
in order; a step starts once every action it consumes has finished (sends never block); a
collective step starts once every member rank has reached it. If no rank can move and some
still have work, the schedule deadlocks.

A plain schedule (bulk.py: single actions of kinds with `bulk_inputs`) is ordered and timed in
numpy instead, wave by wave, with the same result; anything else, and every error, goes step
by step.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator, Sequence

import numpy as np

from .actions import Action
from .bulk import Plain, ascending, plain_arrays, producer_rows, waves
from .errors import ScheduleError
from .gcpause import without_gc
from .kinds import KIND_SPECS, LANES, Input, collective_kinds, side_lanes

#: One entry of an execution order, as `Order` yields it: (ranks that run it, the step, the
#: steps whose outputs it consumes).
OrderEntry = tuple[tuple[int, ...], object, list]


def inputs_of(schedule, action: Action) -> list[Input]:
    """The input edges of one action (its kind spec, read against this schedule)."""
    return KIND_SPECS[action[1]].inputs(schedule, action)


def edges(schedule) -> dict[Action, list[Input]]:
    """The input edges of every action of the schedule: the graph, built in one pass."""
    schedule.reindex()
    specs = KIND_SPECS
    out = {}
    for acts in schedule.actions:
        for item in acts:
            for part in item.parts:
                out[part] = specs[part[1]].inputs(schedule, part)
    return out


def step_dependencies(schedule, item) -> list[Action]:
    """Actions that must finish before a step (an action or a compound) can start."""
    parts = item.parts
    if len(parts) == 1:
        return [edge[1] for edge in inputs_of(schedule, parts[0])]
    own = set(parts)
    return [edge[1] for part in parts for edge in inputs_of(schedule, part) if edge[1] not in own]


def members_of(schedule, action: Action) -> tuple[int, ...] | None:
    """The ranks that run a collective action together (None for an ordinary action)."""
    spec = KIND_SPECS[action[1]]
    return None if spec.members is None else tuple(sorted(spec.members(schedule, action)))


class Order:
    """A feasible execution order, as parallel lists indexed by position in the order:
    `steps[k]` ran on the ranks `ranks[k]` once the steps at the positions `producers[k]` (its
    input edges from other steps) had finished. Integer positions instead of actions keep the
    timing pass (`timed_run`) to list look-ups, and keep a 10^5-step order to three lists.

    An order found in bulk (a plain schedule: bulk.py) keeps its arrays, `waves`, instead; its
    lists are then built only if something reads them (the simulator reads the arrays)."""
    __slots__ = ("_steps", "_ranks", "_producers", "waves")

    def __init__(self, steps: list | None, ranks: list[tuple[int, ...]] | None,
                 producers: list[list[int]] | None, waves: "Waves | None" = None):
        self._steps, self._ranks, self._producers, self.waves = steps, ranks, producers, waves

    @property
    def steps(self) -> list:
        if self._steps is None:
            self._steps = list(map(self.waves.flat.__getitem__, self.waves.row.tolist()))
        return self._steps

    @property
    def ranks(self) -> list[tuple[int, ...]]:
        if self._ranks is None:
            alone = [(r,) for r in range(int(self.waves.rank.max()) + 1)]
            self._ranks = list(map(alone.__getitem__, self.waves.rank.tolist()))
        return self._ranks

    @property
    def producers(self) -> list[list[int]]:
        if self._producers is None:
            n = len(self)
            self._producers = [[p for p in row if p < n]
                               for row in self.waves.producers.tolist()]
        return self._producers

    def __len__(self) -> int:
        return len(self.waves.row) if self._steps is None else len(self._steps)

    def __iter__(self) -> Iterator[OrderEntry]:
        """(ranks, step, the steps it consumes) in order."""
        steps = self.steps
        for ranks, step, before in zip(self.ranks, steps, self.producers):
            yield ranks, step, [steps[k] for k in before]


class Waves:
    """A plain schedule's execution order in arrays, by position in the order: the order runs
    in waves, wave w the positions `bounds[w]:bounds[w + 1]`, at most one step of each rank,
    every input made in an earlier wave. Step k is `flat[row[k]]` (the schedule's actions, rank
    after rank); `rank`, `kind` (an index in `names`) and `stage` of each step; `producers[k]`:
    the positions of its inputs, in its kind's input order, padded with len(order)."""
    __slots__ = ("flat", "row", "rank", "kind", "stage", "names", "producers", "bounds")

    def __init__(self, flat, row, rank, kind, stage, names, producers, bounds):
        self.flat, self.row, self.rank, self.kind, self.stage = flat, row, rank, kind, stage
        self.names, self.producers, self.bounds = names, producers, bounds


def _bulk_order(schedule, plain: Plain) -> Order | None:
    """The execution order of a plain schedule found in waves (bulk.py); None when the
    arrays cannot give one (a kind without `bulk_inputs`, a missing producer, a deadlock)."""
    made = producer_rows(schedule, plain)
    found = None if made is None else waves(plain, made)
    if found is None:
        return None
    row, bounds = found                       # row: position in the order -> row of `plain`
    n = len(row)
    position = np.empty(n + 1, np.int64)
    position[row] = np.arange(n)
    position[n] = n                           # "no input" stays n (past the last position)
    producers = position[np.where(made < 0, n, made)[row]]
    schedule._index = None          # the index of producers is rebuilt when next read
    return Order(None, None, None, Waves(plain.flat, row, plain.rank[row], plain.kind[row],
                                         plain.stage[row], plain.names, producers, bounds))


@without_gc
def execution_order(schedule, plain: Plain | None = None) -> Order:
    """The steps in an order a blocking run could take; raises ScheduleError on deadlock.

    A plain schedule (bulk.py; `plain`, its arrays, if already built) is ordered in waves with
    numpy. Otherwise (or if that finds no order): one topological pass over the dataflow graph,
    event-driven: a rank that cannot move parks on the first missing input (or on a collective
    not every member has reached) and is woken when that changes, so every step is looked at
    once or twice, and the pass is linear.
    """
    s = schedule
    plain = plain_arrays(s) if plain is None else plain
    if plain is not None:
        order = _bulk_order(s, plain)
        if order is not None:
            return order
    s.reindex()
    inputs_fn = {kind: spec.inputs for kind, spec in KIND_SPECS.items()}
    collective = collective_kinds()
    alone = [(r,) for r in range(s.ranks)]  # shared, not one tuple per step

    position = [0] * s.ranks
    placed: dict = {}                       # finished action -> its position in the order
    waiting: dict = defaultdict(list)       # missing action -> ranks parked on it
    parked: dict[int, list] = {}            # rank -> input edges of the step it is stuck at
    arrived: dict = defaultdict(set)        # collective step -> member ranks already there
    ready = list(range(s.ranks))
    steps: list = []
    ranks_of: list[tuple[int, ...]] = []
    producers: list[list[int]] = []
    k = -1                                  # the position of the last step placed
    while ready:
        rank = ready.pop()
        acts = s.actions[rank]
        i, n = position[rank], len(acts)
        deps = parked.pop(rank, None)        # the inputs of the step it parked at, if any
        while i < n:
            item = acts[i]
            if deps is None:
                if type(item) is Action:     # the common case, kept free of function calls
                    deps = inputs_fn[item[1]](s, item)
                else:
                    deps = [edge for part in item for edge in inputs_fn[part[1]](s, part)
                            if edge[1] not in item]
            before = []                      # positions of its inputs, while all are there
            missing = None
            for edge in deps:
                found = placed.get(edge[1])
                if found is None:
                    missing = edge[1]
                    break
                before.append(found)
            if missing is not None:
                waiting[missing].append(rank)
                parked[rank] = deps
                break
            deps = None
            together = collective and item[1] in collective
            if together:
                members = members_of(s, item)
                arrived[item].add(rank)
                if len(arrived[item]) < len(members):
                    break                    # park until the last member arrives
                ranks = members
            else:
                ranks = alone[rank]
            k += 1
            steps.append(item)
            ranks_of.append(ranks)
            producers.append(before)
            if type(item) is Action:
                placed[item] = k
                woken = waiting.pop(item, None)
                if woken:
                    ready.extend(woken)
            else:
                for part in item:
                    placed[part] = k
                    woken = waiting.pop(part, None)
                    if woken:
                        ready.extend(woken)
            if together:                     # a collective moves every member on
                for other in ranks:
                    if other != rank:
                        position[other] += 1
                        ready.append(other)
                arrived.pop(item, None)
            i += 1
        position[rank] = i
    stuck = [r for r in range(s.ranks) if position[r] < len(s.actions[r])]
    if stuck:
        raise ScheduleError(_explain_deadlock(s, position, stuck, arrived), s,
                            [(r, position[r]) for r in stuck])
    return Order(steps, ranks_of, producers)


def step_times(order: Order, duration: Callable | Sequence[float], comm: float = 0.0,
               lanes: bool = True, tail: Sequence[float] | None = None,
               data_edge: Callable | None = None) -> tuple[list[float], list[float]]:
    """The start and end of every step of an execution order, by position, in one pass along
    it: each rank runs its steps in order; a step starts once its inputs have arrived (+`comm`
    when they cross ranks) and, for a collective, once every member is free. The simulator
    runs this with its cost model, the grid with one time unit per step, the critical path
    with both.

    A kind registered with `lane="comm"` (a gradient all-reduce) occupies the rank's
    communication lane instead of its compute, one with `lane="copy"` (an offload) its copy
    lane: the actions after it on the rank do not wait for it, so the overlap of communication
    and copies with compute is what the model predicts. With
    `lanes=False` (the step grid: one cell per action) every action takes its rank's turn.

    `duration` is the time of a step (a function of it), or the list of times by position.

    `tail[k]`, if given: seconds of asynchronous communication step k leaves running on its
    rank's communication lane when its compute ends (a braided step's last tensor-parallel
    all-reduce): the rank computes on, and what the step produces is ready only after it — for
    a consumer on another rank, or on the same rank when `data_edge(consumer, producer)` says
    the edge carries data (not when it only orders two steps, as W after its I)."""
    if order.waves is not None and tail is None:
        begin, finish = times_in_waves(order, duration, comm, lanes)
        return begin.tolist(), finish.tolist()
    steps, ran_on = order.steps, order.ranks
    late: dict | None = {} if tail is not None else None     # position -> output ready
    took = map(duration, steps) if callable(duration) else duration
    begin = [0.0] * len(steps)
    finish = [0.0] * len(steps)
    free: dict = defaultdict(float)      # rank (compute) or (rank, lane) -> when it is free
    beside = side_lanes() if lanes else {}   # kind -> its side lane
    for k, (ranks, item, before, time) in enumerate(zip(ran_on, steps, order.producers, took)):
        if len(ranks) == 1:
            rank = ranks[0]
            lane = (rank, beside[item[1]]) if beside and type(item) is Action \
                and item[1] in beside else rank
            start = free[lane]
            for p in before:
                done = finish[p]
                if late and p in late and (rank not in ran_on[p] or data_edge(item, steps[p])):
                    done = late[p]
                arrival = done + (comm if rank not in ran_on[p] else 0.0)
                if arrival > start:
                    start = arrival
            begin[k] = start
            free[lane] = finish[k] = start + time
            if late is not None and tail[k]:
                ready = free[(rank, "comm")] = max(finish[k], free[(rank, "comm")]) + tail[k]
                late[k] = ready
            continue
        # A collective starts once every member has reached it; one on the communication lane
        # (an all-reduce on a side stream) leaves the members' compute running.
        aside = beside[item[1]] if beside and type(item) is Action and item[1] in beside \
            else None
        start = max(max(free[r], free[(r, aside)]) if aside else free[r] for r in ranks)
        for p in before:
            crosses = any(r not in ran_on[p] for r in ranks)
            start = max(start, finish[p] + (comm if crosses else 0.0))
        begin[k] = start
        finish[k] = start + time
        for rank in ranks:
            free[(rank, aside) if aside else rank] = finish[k]
    return begin, finish


def times_in_waves(order: Order, duration: Callable | Sequence[float], comm: float = 0.0,
                   lanes: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`step_times` (without tails) of an order found in waves, a wave at a time: the same
    sums and maxima, so the same times. Returns (start, end) arrays by position."""
    bulk = order.waves
    n = len(order)
    took = np.fromiter(map(duration, order.steps), float, n) if callable(duration) \
        else np.asarray(duration, float)
    beside = side_lanes() if lanes else {}
    lane_of = np.array([LANES.index(beside.get(k, "compute")) for k in bulk.names], np.int64)
    lane = bulk.rank * len(LANES) + lane_of[bulk.kind]      # each rank's lanes, side by side
    # A step waits for the step before it on its lane (its lane is free when that ends): an
    # input like the others. The order keeps each rank's program order, so a stable sort by
    # lane lists each lane's steps in it. Position n + 1 (the first on a lane): free at 0.
    by_lane = np.argsort(lane.astype(np.int32 if lane.max() >= 2 ** 15 else np.int16),
                         kind="stable")          # (a radix sort, for 16-bit numbers)
    follows = lane[by_lane[1:]] == lane[by_lane[:-1]]
    before = np.full(n, n + 1)
    before[by_lane[1:][follows]] = by_lane[:-1][follows]
    producers = bulk.producers
    if took.min() >= 0:    # an input made before on the same lane ends before the lane is free
        made_by = np.minimum(producers, n - 1)
        same = (lane[made_by] == lane[:, None]) & (producers < n)
        producers = ascending(np.where(same, n, producers))      # "no input" (n) last
    crosses = (bulk.rank[np.minimum(producers, n - 1)] != bulk.rank[:, None]) & (producers < n)
    keep = (producers < n).any(axis=0)
    inputs = [np.ascontiguousarray(column) for column in producers[:, keep].T]
    delays = [np.ascontiguousarray(np.where(c, comm, 0.0)) for c in crosses[:, keep].T] \
        if comm else [None] * len(inputs)
    finish = np.full(n + 2, -np.inf)          # n: "no input", never later than anything
    finish[n + 1] = 0.0
    begin = np.empty(n)
    bounds = bulk.bounds.tolist()
    for a, b in zip(bounds, bounds[1:]):
        start = finish[before[a:b]]
        for made, delay in zip(inputs, delays):
            arrival = finish[made[a:b]]
            np.maximum(start, arrival if delay is None else arrival + delay[a:b], out=start)
        begin[a:b] = start
        np.add(start, took[a:b], out=finish[a:b])
    return begin, finish[:n]


def timed_run(order: Order, duration: Callable | Sequence[float], comm: float = 0.0,
              lanes: bool = True) -> Iterator[tuple[int, object, float, float]]:
    """Yield (rank, step, start, end) along an execution order (`step_times`); a collective
    step once for each of its ranks."""
    for ranks, item, start, end in zip(order.ranks, order.steps,
                                       *step_times(order, duration, comm, lanes)):
        for rank in ranks:
            yield rank, item, start, end


def _explain_deadlock(s, position, stuck, arrived) -> str:
    where = {}
    for r, acts in enumerate(s.actions):
        for i, item in enumerate(acts):
            for part in item.parts:
                where.setdefault(part, (r, i))
    done = {p for r, acts in enumerate(s.actions) for item in acts[:position[r]] for p in item.parts}
    lines = ["deadlock: no rank can make progress."]
    for rank in stuck:
        item = s.actions[rank][position[rank]]
        missing = next((d for d in step_dependencies(s, item) if d not in done), None)
        if missing is None:          # waiting in a collective for members that never come
            members = members_of(s, item) or ()
            absent = [m for m in members if m not in arrived.get(item, ())]
            blockers = ", ".join(f"rank {m} is stuck before it, at {s.actions[m][position[m]]}"
                                 for m in absent if position[m] < len(s.actions[m]))
            lines.append(f"rank {rank} waits in {item} ({KIND_SPECS[item[1]].description}, a "
                         f"collective of ranks {', '.join(map(str, members))}) for rank(s) "
                         f"{', '.join(map(str, absent))}: {blockers or 'they never reach it'}")
            continue
        if missing not in where:
            lines.append(f"rank {rank} cannot run {item}: it needs {missing}, which no rank runs")
            continue
        other, _ = where[missing]
        blocker = s.actions[other][position[other]]
        who = "it" if other == rank else f"rank {other}"
        lines.append(f"rank {rank} waits for {missing} (to run {item}), "
                     f"which {who} only runs after {blocker}")
    return "\n".join(lines)
