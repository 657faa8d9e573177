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

PASSES = ("F0", "F1", "I1", "I0", "W")
Plan = dict[str, list[int]]       # one rank: pass → slot of its k-th action


def put_w_in_holes(plan: Plan) -> Plan:
    """The plan with a W list: each W in the first free slot after the I it follows."""
    taken = {slot for name in PASSES[:4] for slot in plan[name]}
    backwards = sorted(plan["I1"] + plan["I0"])
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
    adds = {slot: +1 for slot in plan["F0"] + plan["F1"]}
    if "W" in plan:
        adds.update({slot: -1 for slot in plan["W"]})
        backs: set[int] = set()
    else:
        backs = set(plan["I1"] + plan["I0"]).difference(adds)   # a forward's slot is its own
    held = most = owed = 0
    last = -1
    # Slot by slot, but only where something happens (the squeeze asks this for every move
    # it tries): each hole since the last such slot runs one owed W.
    for slot in sorted(chain(adds, backs)):
        if owed:
            ran = min(owed, slot - last - 1)
            owed -= ran
            held -= ran
        last = slot
        change = adds.get(slot)
        if change is None:
            owed += 1                      # a backward: one W owed
        else:
            held += change
            if held > most:
                most = held
    return most


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
