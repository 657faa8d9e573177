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
"""
from __future__ import annotations

from itertools import chain

import numpy as np

PASSES = ("F0", "F1", "I1", "I0", "W")
Plan = dict[str, list[int]]       # one rank: pass → slot of its k-th action


def put_w_in_holes(plan: Plan) -> Plan:
    """The plan with a W list: each W in the first free slot after the I it follows."""
    taken = {slot for name in PASSES[:4] for slot in plan[name]}
    backwards = set(plan["I1"] + plan["I0"])
    slots, owed, slot = [], 0, 0
    for slot in range(max(taken) + 1):
        if slot in taken:
            owed += slot in backwards          # a backward makes one W owed
        elif owed:
            slots.append(slot)
            owed -= 1
    slots += range(slot + 1, slot + 1 + owed)  # the W's left over close the step
    return {**{name: plan[name] for name in PASSES[:4]}, "W": slots}


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
    W in slot order (the squeeze asks it for every move it tries, so in numpy). None when two
    actions share a slot, which the slot-by-slot walk resolves."""
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


def _earliest(plans: list[Plan], rank: int, name: str, k: int) -> int:
    """The first slot this action may take: after its inputs and after its own pass's k−1."""
    last = len(plans) - 1
    own = plans[rank]
    inputs = [own[name][k - 1]] if k else []
    if name == "F0" and rank > 0:
        inputs.append(plans[rank - 1]["F0"][k])      # from the rank above, going down
    elif name == "F1":
        inputs.append(own["F0"][k])                  # the turn at the bottom of the V …
        if rank < last:
            inputs.append(plans[rank + 1]["F1"][k])  # … or from the rank below, coming up
    elif name == "I1":
        inputs.append(own["F1"][k])                  # the loss on rank 0's chunk 1 …
        if rank > 0:
            inputs.append(plans[rank - 1]["I1"][k])  # … or the gradient from the rank above
    elif name == "I0":
        inputs.append(own["I1"][k])
        if rank < last:
            inputs.append(plans[rank + 1]["I0"][k])
    elif name == "W":
        inputs.append(sorted(own["I1"] + own["I0"])[k])
    return max(inputs, default=-1) + 1


def squeeze(plans: list[Plan], warmup: bool) -> list[Plan]:
    """Pull warm-up (if `warmup`) and cool-down actions into earlier free slots, keeping every
    rank's peak within the largest peak of the plans as given. The warm-up ends when rank 0
    runs its first I on chunk 0 (microbatch 0 has come back down the V); the cool-down starts
    after rank 0's last forward on chunk 0."""
    plans = [{name: list(slots) for name, slots in plan.items()} for plan in plans]
    limit = max(peak(plan) for plan in plans)
    last_mb = len(plans[0]["F0"]) - 1
    order = sorted((slot, rank, PASSES.index(name), k) for rank, plan in enumerate(plans)
                   for name, slots in plan.items() for k, slot in enumerate(slots))
    used: list[set[int]] = [set() for _ in plans]
    phase = "warm-up"
    for slot, rank, kind, k in order:
        name = PASSES[kind]
        if phase == "warm-up" and name == "I0" and rank == 0:
            phase = "steady"
        if phase == "steady" or (phase == "warm-up" and not warmup):
            if phase == "steady" and name == "F0" and k == last_mb:
                phase = "cool-down"
            used[rank].add(slot)
            continue
        plan = plans[rank]
        for earlier in range(_earliest(plans, rank, name, k), slot):
            if earlier in used[rank]:
                continue
            plan[name][k] = earlier
            if peak(plan) <= limit:
                break
        else:
            plan[name][k] = slot
        used[rank].add(plan[name][k])
    return plans
