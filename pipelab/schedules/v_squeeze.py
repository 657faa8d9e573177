"""The squeeze of "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024,
arXiv 2405.15362, §3; the authors' `zbv_greedy.py` calls it reorder): repeating a building block
leaves holes in the warm-up and the cool-down, where the block's slots wait for a pipeline that
is not full yet or already draining. The squeeze walks every action in slot order and pulls it
into the earliest free slot after its inputs, as long as its rank's activation peak stays within
the block's own. Steady-state actions never move: the block already packs them.

A rank's plan is five lists of slots, one per pass, indexed by microbatch:

    F0  forward on chunk 0 (stage r, down the V)     I1  input gradient on chunk 1 (first back)
    F1  forward on chunk 1 (stage 2p−1−r, back up)   I0  input gradient on chunk 0
    W   weight gradients, the k-th after the rank's k-th input gradient (any chunk)

Memory is counted in chunk units (one chunk forward holds 1; a rank's worth of layers is 2):
a forward adds one, a weight gradient frees one (the input gradient frees nothing, the
simulator's `i_frees=0`). Without a W list, the W's are assumed to run in the holes, oldest first.

`peak` is the definition; the squeeze does not ask it for every slot it tries. Every rank stays
within the limit all along (each move is taken only if it keeps it so), so a move is allowed
exactly when the levels it changes stay within it, and the squeeze keeps each rank's level after
every slot (`_ListedLevels`, `_HoleLevels`) and looks only at the slots a move changes. Two
actions never share a slot there: the plans come in with one a slot (`_movable` checks); the
walk is in slot order and moves actions only earlier, so the actions walked so far are before
the current one's slot and the others after it; and it moves only into a free slot before its
own (so `_listed_peak`'s None never arises in a squeeze).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from itertools import chain

import numpy as np

PASSES = ("F0", "F1", "I1", "I0", "W")
FORWARD, BACKWARD, WEIGHT = {0, 1}, {2, 3}, 4      # PASSES' indices by what they do to memory
Plan = dict[str, list[int]]       # one rank: pass → slot of its k-th action


def put_w_in_holes(plan: Plan) -> Plan:
    """The plan with a W list: each W in the first free slot after the I it follows (the owed
    W's queue for the holes, oldest first); the W's left over close the step."""
    return put_ws_in_holes([plan])[0]


def put_ws_in_holes(plans: list[Plan]) -> list[Plan]:
    """`put_w_in_holes` for every rank at once. Past its last action a rank has only holes, so
    the W's left over take the slots after it: the queue places them too, on a grid wide enough."""
    spare = max(len(plan["I1"]) + len(plan["I0"]) for plan in plans)
    grid = slot_grid(plans, {"F0": 1, "F1": 1, "I1": 2, "I0": 2}, spare)
    runs = queue_runs(grid == 2, grid == 0)
    return [{**{name: plan[name] for name in PASSES[:4]}, "W": np.flatnonzero(row).tolist()}
            for plan, row in zip(plans, runs)]


def queue_runs(arrive: np.ndarray, serve: np.ndarray) -> np.ndarray:
    """Which `serve` slots run a waiting item: items join a queue at the `arrive` slots and
    each serve slot runs one if any waits (no slot both arrives and serves). Along the last
    axis, so that one call answers for every rank."""
    waiting = _waiting(arrive.astype(np.int64) - serve)
    before = np.zeros_like(waiting)
    before[..., 1:] = waiting[..., :-1]
    return serve & (before > 0)


def _waiting(step: np.ndarray, start: int = 0) -> np.ndarray:
    """The queue's length after each slot, a slot adding `step` (+1 an arrival, −1 a chance to
    run one) but never going below 0: the walk less its deepest dip below 0 so far (Lindley's
    q = max(0, q + step), unrolled so that numpy does it)."""
    walk = start + np.cumsum(step, axis=-1)
    return walk - np.minimum(np.minimum.accumulate(walk, axis=-1), 0)


def peak(plan: Plan) -> int:
    """The rank's activation peak in chunk units; with no W list the W's fill the holes."""
    if "W" not in plan:
        return _holes_peak(plan)
    listed = _listed_peak(plan)
    if listed is not None:
        return listed
    adds = {slot: +1 for slot in plan["F0"] + plan["F1"]}
    adds.update({slot: -1 for slot in plan["W"]})      # a W on a forward's slot replaces it
    held = most = 0
    for slot in sorted(adds):
        held += adds[slot]
        most = max(most, held)
    return most


def _holes_peak(plan: Plan) -> int:
    """The peak of a plan without a W list: each backward owes one W, and the owed W's run in
    the holes (free slots), oldest first. The W's run by the end of the k-th hole-run are a
    queue's departures, min(owed, capacity) unrolled: G_k + min over j <= k of (A_j − G_j), with
    G the holes so far and A the backwards before them; so the whole walk is array sums."""
    forwards = set(plan["F0"]).union(plan["F1"])
    if not forwards:
        return 0
    backwards = set(plan["I1"]).union(plan["I0"]).difference(forwards)   # a forward's slot is its own
    slots = np.fromiter(chain(forwards, backwards), np.int64, len(forwards) + len(backwards))
    is_back = np.zeros(len(slots), np.int64)
    is_back[len(forwards):] = 1
    order = np.argsort(slots)
    slots, is_back = slots[order], is_back[order]
    holes = np.cumsum(np.diff(slots, prepend=-1) - 1)   # free slots before each event
    owed_before = np.cumsum(is_back) - is_back         # backwards before each event
    ran = holes + np.minimum.accumulate(owed_before - holes)
    held = np.cumsum(1 - is_back) - ran
    return max(0, int(held[is_back == 0].max()))


def _listed_peak(plan: Plan) -> int | None:
    """The peak of a plan whose W's have slots: the highest running sum of +1 a forward and −1 a
    W in slot order. None when two actions share a slot, which the slot-by-slot walk resolves."""
    forwards = plan["F0"] + plan["F1"]
    slots = np.array(forwards + plan["W"], dtype=np.int64)
    if not len(slots):
        return 0
    change = np.ones(len(slots), np.int64)
    change[len(forwards):] = -1
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    if (ordered[1:] == ordered[:-1]).any():
        return None
    return max(0, int(np.cumsum(change[order]).max()))


def squeeze(plans: list[Plan], warmup: bool) -> list[Plan]:
    """Pull warm-up (if `warmup`) and cool-down actions into earlier free slots, keeping every
    rank's peak within the largest peak of the plans as given. The warm-up ends when rank 0
    runs its first I on chunk 0 (microbatch 0 has come back down the V); the cool-down starts
    after rank 0's last forward on chunk 0. Each action, in slot order, takes the first free
    slot after its inputs at which its rank's peak (`peak`) stays within the limit, if any.
    The plans must have one action a slot on each rank, each after its inputs."""
    plans = [{name: list(slots) for name, slots in plan.items()} for plan in plans]
    moves = _movable(plans, warmup)
    if not moves:
        return plans
    listed = "W" in plans[0]
    levels = (_ListedLevels if listed else _HoleLevels)(plans)
    backs = [sorted(plan["I1"] + plan["I0"]) for plan in plans] if listed else None
    inputs = _inputs(plans, backs)
    for slot, rank, kind, k in moves:
        own, waits = inputs[rank][kind]
        start = own[k - 1] if k else -1
        for source in waits:
            if source[k] > start:
                start = source[k]
        if start + 1 >= slot:
            continue
        new = levels.first_fit(rank, kind, start + 1, slot)
        if new is None:
            continue
        own[k] = new
        levels.move(rank, kind, slot, new)
        if kind in BACKWARD and listed:        # the W's inputs, kept in slot order
            ranked = backs[rank]
            del ranked[bisect_left(ranked, slot)]
            insort(ranked, new)
    return plans


def _inputs(plans: list[Plan], backs: list[list[int]] | None) -> list[list[tuple]]:
    """For each rank and pass (PASSES' order): its own slots (its k-th follows its k−1-th) and
    the lists whose k-th slot it follows; a W follows its rank's k-th backward in slot order
    (`backs`, kept sorted as they move). The lists are the plans' own, which moves update."""
    last = len(plans) - 1
    table = []
    for rank, own in enumerate(plans):
        above = [plans[rank - 1]] if rank > 0 else []
        below = [plans[rank + 1]] if rank < last else []
        waits = ([plan["F0"] for plan in above],                  # from the rank above, going down
                 [own["F0"]] + [plan["F1"] for plan in below],    # the turn at the V's bottom, or up
                 [own["F1"]] + [plan["I1"] for plan in above],    # the loss, or the gradient from above
                 [own["I1"]] + [plan["I0"] for plan in below],
                 [backs[rank]] if backs else [])
        table.append([(own[name], waits[kind]) for kind, name in enumerate(PASSES) if name in own])
    return table


def _flat(plans: list[Plan], names: list[str]) -> tuple[np.ndarray, ...]:
    """Every action of the named passes as four arrays: slot, rank, pass (index), k."""
    lists = [plan[name] for plan in plans for name in names]
    sizes = np.array([len(slots) for slots in lists])
    slot = np.fromiter(chain.from_iterable(lists), np.int64, int(sizes.sum()))
    rank = np.repeat(np.arange(len(plans)).repeat(len(names)), sizes)
    kind = np.repeat(np.tile([PASSES.index(name) for name in names], len(plans)), sizes)
    k = np.arange(len(slot)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return slot, rank, kind, k


def _movable(plans: list[Plan], warmup: bool) -> list[tuple[int, int, int, int]]:
    """The actions the squeeze tries to move, (slot, rank, pass, k) in slot order (then rank):
    the warm-up's if `warmup`, up to rank 0's first I on chunk 0, and the cool-down's, after
    the first last forward on chunk 0 that comes after it."""
    slot, rank, kind, k = _flat(plans, [name for name in PASSES if name in plans[0]])
    key = slot * len(plans) + rank
    order = np.argsort(key, kind="stable")
    clash = np.flatnonzero(np.diff(key[order]) == 0)
    if len(clash):
        raise ValueError(f"the squeeze takes one action a slot per rank; rank "
                         f"{rank[order[clash[0]]]} has two at slot {slot[order[clash[0]]]}")
    slot, rank, kind, k = slot[order], rank[order], kind[order], k[order]
    steady = np.flatnonzero((kind == PASSES.index("I0")) & (rank == 0))
    start = int(steady[0]) if len(steady) else len(slot)
    last = np.flatnonzero((kind == 0) & (k == len(plans[0]["F0"]) - 1))
    last = last[last > start]
    picked = [np.arange(start)] if warmup else []
    if len(last):
        picked.append(np.arange(int(last[0]) + 1, len(slot)))
    if not picked:
        return []
    picked = np.concatenate(picked)
    return list(zip(*(column[picked].tolist() for column in (slot, rank, kind, k))))


def slot_grid(plans: list[Plan], code: dict[str, int], spare: int = 1) -> np.ndarray:
    """One row a rank, one column a slot: `code[name]` where that pass runs, 0 where nothing
    does (a hole); `spare` columns more after the last slot."""
    slot, rank, kind, _ = _flat(plans, list(code))
    value = np.zeros(len(PASSES), np.int8)
    value[[PASSES.index(name) for name in code]] = list(code.values())
    grid = np.zeros((len(plans), int(slot.max(initial=-1)) + 1 + spare), np.int8)
    grid[rank, slot] = value[kind]
    return grid


UP, DOWN = bytes([*range(1, 256), 255]), bytes([0, *range(255)])   # add or take one, bytewise


class _ListedLevels:
    """Each rank's level (forwards less W's) after every slot, with the W's in their slots, one
    byte a slot. A forward moved from s to e < s adds one on [e, s): allowed when that range is
    below the limit; a W moved earlier only lowers levels, an I changes none: both allowed."""

    def __init__(self, plans: list[Plan]):
        grid = slot_grid(plans, {"F0": 1, "F1": 1, "I1": 2, "I0": 2, "W": 3})
        level = np.cumsum(grid == 1, axis=1) - np.cumsum(grid == 3, axis=1)
        self.limit = max(0, int(level.max()))
        if level.min() < 0 or self.limit > 254:
            raise ValueError(f"the squeeze takes plans whose W's follow their forwards, with a "
                             f"peak under 255 chunks; got levels from {level.min()} to {self.limit}")
        self.level = [bytearray(row.astype(np.uint8).tobytes()) for row in level]
        self.free = [bytearray(row.astype(bool).tobytes()) for row in grid]   # 0 where free

    def first_fit(self, rank: int, kind: int, start: int, slot: int) -> int | None:
        """The first free slot in [start, slot) the action may take, or None."""
        if kind in FORWARD:
            start = self.level[rank].rfind(self.limit, start, slot) + 1 or start
        found = self.free[rank].find(0, start, slot)
        return None if found < 0 else found

    def move(self, rank: int, kind: int, slot: int, new: int) -> None:
        free, level = self.free[rank], self.level[rank]
        free[slot], free[new] = 0, 1
        if kind in FORWARD:
            level[new:slot] = level[new:slot].translate(UP)
        elif kind == WEIGHT:
            level[new:slot] = level[new:slot].translate(DOWN)


class _HoleLevels:
    """Each rank's level after every slot with no W list: each backward owes a W and the owed
    W's run in the holes, oldest first. `owed[t]` and `level[t]` are the W's owed and the
    level after slot t − 1 (index 0: before slot 0), as lists (one short walk a move).

    Moving an action from s to a hole e < s changes nothing before e and, after s, lowers or
    keeps every level (the hole it leaves at s runs a W if one is owed). In [e, s): if e ran a
    W (one was owed), that W waits for the next hole that ran none, z; a forward adds one on
    [e, s) and one more on [e, z); a backward adds one on [e, z) if e ran a W, else nothing."""

    def __init__(self, plans: list[Plan]):
        grid = slot_grid(plans, {"F0": 1, "F1": 1, "I1": 2, "I0": 2})
        owed = _waiting(np.array([-1, 0, 1])[grid])            # a hole runs one, a backward owes one
        level = owed + np.cumsum(np.array([0, 1, -1])[grid], axis=1)   # level − owed: forwards − backwards
        self.limit = max(0, int(level.max()))
        self.owed = [[0, *row] for row in owed.tolist()]
        self.level = [[0, *row] for row in level.tolist()]
        self.what = [bytearray(row.tobytes()) for row in grid]   # 0 hole, 1 forward, 2 backward

    def first_fit(self, rank: int, kind: int, start: int, slot: int) -> int | None:
        """The first hole in [start, slot) the action may take, or None."""
        level, owed, what, limit = self.level[rank], self.owed[rank], self.what[rank], self.limit
        if kind in FORWARD:
            below = level[start + 1:slot + 1]
            if limit in below:                  # levels never pass the limit: after its last
                start += len(below) - below[::-1].index(limit)
        bump = 2 if kind in FORWARD else 1
        hole = what.find(0, start, slot)
        while hole >= 0:
            if not owed[hole]:
                return hole
            most = level[hole + 1]
            for later in range(hole + 1, slot):
                if not what[later] and not owed[later]:
                    break
                most = max(most, level[later + 1])
            if most + bump <= limit:
                return hole
            hole = what.find(0, hole + 1, slot)
        return None

    def move(self, rank: int, kind: int, slot: int, new: int) -> None:
        """Walk the new plan from `new` until past `slot` it is back in step with the old one."""
        what, owed, level = self.what[rank], self.owed[rank], self.level[rank]
        what[new], what[slot] = what[slot], 0
        waiting, held = owed[new], level[new]
        for t in range(new, len(what)):
            step = what[t]
            if step == 1:
                held += 1
            elif step == 2:
                waiting += 1
            elif waiting:
                waiting, held = waiting - 1, held - 1
            if t >= slot and owed[t + 1] == waiting and level[t + 1] == held:
                break
            owed[t + 1], level[t + 1] = waiting, held
