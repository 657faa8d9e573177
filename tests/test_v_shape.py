"""V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024):
their bubbles against the authors' generator, their peaks against the paper's closed forms, the
orderings the paper's figure makes, and live runs that compute the unsplit model exactly.

Units: costs are a rank's worth of layers (a chunk costs half); peaks count microbatches of a
rank's layers (a chunk forward holds ½). Simulated unless the test says live."""
from __future__ import annotations

import random
from itertools import chain

import pytest

import pipelab as pl
from pipelab.sim.compare import longest_span
from pipelab.schedules.v_shape import (INTERVAL, _block_plans, _rank_actions, block_actions,
                                       v_half_block, v_min_block)
from pipelab.schedules.v_squeeze import PASSES, peak, put_w_in_holes, squeeze

CLOSED_PEAK = {"v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3}
RATIOS = [(1, 1, 1), (1, 1.5, 0.5), (1, 2, 1), (6, 5, 4)]

# The authors' zbv_greedy.py (sail-sg/zero-bubble-pipeline-parallelism), run as it ships with
# c_cost=0: the longest per-stage span minus the work, in its units (every pass of a chunk
# costs the given figure, so a rank's worth of layers costs twice it).
AUTHORS = [
    ("v-half", 2, 4, (1, 1, 1), 1), ("v-half", 4, 8, (1, 1, 1), 5),
    ("v-half", 4, 8, (1, 1.5, 0.5), 14), ("v-half", 4, 16, (1, 2, 1), 26),
    ("v-half", 4, 8, (6, 5, 4), 41), ("v-half", 8, 16, (1, 1, 1), 17),
    ("v-half", 8, 32, (1, 1.5, 0.5), 45), ("v-half", 8, 16, (1, 2, 1), 48),
    ("v-half", 8, 16, (6, 5, 4), 116),
    ("v-min", 4, 8, (1, 1, 1), 11), ("v-min", 4, 8, (1, 1.5, 0.5), 35.5),
    ("v-min", 4, 16, (1, 2, 1), 77), ("v-min", 4, 16, (6, 5, 4), 145),
    ("v-min", 8, 16, (1, 1, 1), 27), ("v-min", 8, 32, (1, 1.5, 0.5), 126),
    ("v-min", 8, 16, (1, 2, 1), 99), ("v-min", 8, 32, (6, 5, 4), 324),
]


def _sim(name: str, p: int, m: int, fiw=(1, 1, 1)) -> pl.Timeline:
    F, I, W = fiw
    return pl.simulate(pl.schedule(name, ranks=p, microbatches=m), pl.Costs(F=F, I=I, W=W))


def _idle(tl: pl.Timeline, m: int, fiw) -> float:
    """Idle time of the longest rank's span (the papers' bubble): span minus the work."""
    return longest_span(tl) - m * sum(fiw)


@pytest.mark.parametrize("name,p,m,fiw,theirs", AUTHORS)
def test_bubble_is_the_authors_generator_slot_for_slot(name, p, m, fiw, theirs):
    assert _idle(_sim(name, p, m, fiw), m, fiw) == pytest.approx(theirs / 2)


def test_peaks_are_the_papers_closed_forms_balanced_over_the_ranks():
    for name, closed in CLOSED_PEAK.items():
        for p in (3, 4, 5, 6, 8):
            for m in (2 * p, 3 * p + 1):
                for fiw in RATIOS[:2]:
                    peaks = _sim(name, p, m, fiw).peak_activations()
                    assert max(peaks.values()) == closed(p), (name, p, m, fiw, peaks)
                    # balanced: every rank within one chunk (half a microbatch) of the busiest
                    assert max(peaks.values()) - min(peaks.values()) <= 0.5, (name, p, m, peaks)


def test_memory_orders_v_min_below_v_half_below_zb_v_below_zb_h2():
    for p in (4, 8):
        m = 2 * p
        peak = {n: max(_sim(n, p, m).peak_activations().values())
                for n in ("v-min", "v-half", "zb-v", "1f1b", "zb-h2")}
        assert peak["v-min"] < peak["v-half"] < peak["zb-v"] == peak["1f1b"] == p < peak["zb-h2"]


@pytest.mark.parametrize("p", [4, 8])
def test_bubbles_against_1f1b_at_equal_costs(p):
    """The README's table: V-Half about half of 1F1B's bubble, V-Min about two thirds."""
    m = 2 * p
    one_f_one_b = _sim("1f1b", p, m).makespan - 3 * m          # (p − 1)(F + I + W)
    assert one_f_one_b == 3 * (p - 1)
    half, third = (_sim(n, p, m).makespan - 3 * m for n in ("v-half", "v-min"))
    assert 0 < half <= one_f_one_b / 2 < third <= 2 * one_f_one_b / 3


@pytest.mark.parametrize("p", [4, 8])
def test_v_half_steady_state_has_no_bubble_where_the_paper_says(p):
    """W + 2I ≥ 2F and W + 2F ≥ 2I: doubling m adds work and no idle time; outside the
    condition (W + 2F < 2I at 1 : 1.5 : 0.5) every further microbatch adds some."""
    def grows(fiw) -> float:
        return _idle(_sim("v-half", p, 4 * p, fiw), 4 * p, fiw) - _idle(_sim("v-half", p, 2 * p, fiw), 2 * p, fiw)
    for F, I, W in [(1, 1, 1), (1, 1.25, 0.75), (1.2, 1, 0.8), (1, 0.8, 1.5)]:
        assert W + 2 * I >= 2 * F and W + 2 * F >= 2 * I
        assert grows((F, I, W)) == pytest.approx(0, abs=1e-9), (F, I, W)
    assert grows((1, 1.5, 0.5)) > 0


def test_blocks_never_claim_one_slot_twice():
    """A block's four passes fall in four different slots modulo the interval, at any p: the
    blocks of consecutive microbatches interleave without a clash (what `g` is for)."""
    for block_of in (v_half_block, v_min_block):
        for p in range(2, 65):
            for rank, block in enumerate(block_of(p)):
                assert len({slot % INTERVAL for slot in block}) == 4, (block_of.__name__, p, rank)


def test_the_squeeze_shortens_the_warm_up_without_raising_a_peak():
    """Read straight off the repeated block, V-Half at p=4, m=8 idles 6 per rank (the block's
    warm-up and cool-down holes); the squeeze brings it to 2.5 at the same peak, 3."""
    plain = pl.Schedule(block_actions(4, 8, v_half_block, squeezed=False),
                        placement=pl.v_placement(4), microbatches=8, name="v-half block")
    for tl, idle in [(pl.simulate(plain), 6), (_sim("v-half", 4, 8), 2.5)]:
        assert tl.makespan - 24 == idle and max(tl.peak_activations().values()) == 3


def test_refusals_name_the_parameter_and_the_rule():
    for name in CLOSED_PEAK:
        with pytest.raises(ValueError, match="exactly 2 chunks per rank"):
            pl.schedule(name, ranks=4, microbatches=8, chunks=3)
        with pytest.raises(ValueError, match="ranks >= 2"):
            pl.schedule(name, ranks=1, microbatches=4)


CFG = pl.ModelConfig(n_layers=6, d_model=32, n_heads=4, seq_len=16)


def test_live_runs_are_exact_and_v_min_holds_less(clusters):
    """Live on 2 ranks, one small run each: the unsplit model's loss and gradients, each
    rank's actions in the schedule's order, and the meter's rank-0 peak lower for V-Min, whose
    blocks live shorter (simulated 1.5 against 2 microbatches)."""
    peaks = {}
    for name in ("v-half", "v-min"):
        sched = pl.schedule(name, ranks=2, microbatches=4)
        res = clusters(2).run(sched, model=CFG, seed=3)
        assert res.max_grad_error <= 1e-5, (name, res.grad_errors)
        assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
        for rank in range(2):
            assert [e.action for e in res.timeline.events_of(rank)] == sched.actions[rank]
        peaks[name] = res.peak_activations
    assert peaks["v-min"][0] < peaks["v-half"][0]


def test_memory_bubble_table_puts_the_closed_forms_beside_the_simulation():
    from pipelab.views.memory_bubble import memory_bubble_table, plot_memory_bubble
    rows = {r["name"]: r for r in memory_bubble_table(4, 8)}
    for r in rows.values():
        assert r["peak"] == r["closed_peak"], r
    assert rows["1f1b"]["bubble"] == pytest.approx(3 / 11) == rows["1f1b"]["closed_bubble"]
    assert rows["zb-v"]["bubble"] == 0 and rows["zb-h1"]["bubble"] == pytest.approx(3 / 27)
    # V-Half and V-Min at or below the README's approximate forms
    for name in ("v-half", "v-min"):
        assert 0 < rows[name]["bubble"] <= rows[name]["closed_bubble"]
    uneven = {r["name"]: r for r in memory_bubble_table(4, 8, pl.Costs(F=1, I=1.5, W=0.5))}
    assert uneven["v-half"]["closed_bubble"] is None and uneven["zb-h1"]["closed_bubble"] is not None
    ax = plot_memory_bubble(list(rows.values()))
    assert "simulated" in ax.get_title()


def _walked_peak(plan: dict) -> int:
    """The definition, slot by slot: a forward adds one; a W frees one, in its listed slot or,
    with no W list, in the first hole (free slot) after the backward that owes it."""
    forwards, backwards = set(plan["F0"] + plan["F1"]), set(plan["I1"] + plan["I0"])
    listed = set(plan.get("W", ()))
    held = most = owed = 0
    for slot in range(max(forwards | backwards | listed, default=-1) + 1):
        if slot in forwards:
            held += 1
            most = max(most, held)
        elif slot in listed:
            held -= 1
        elif "W" not in plan and slot in backwards:
            owed += 1
        elif owed and slot not in backwards:
            owed, held = owed - 1, held - 1
    return most


def test_squeeze_peak_is_the_slot_by_slot_walk():
    """v_squeeze.peak (array sums, asked for every move the squeeze tries) against the walk,
    on random plans with one action a slot, with and without a W list."""
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.randint(1, 10)
        listed = rng.random() < 0.5
        slots = rng.sample(range(6 * n + 10), 5 * n if listed else 4 * n)
        plan = {name: slots[i * n:(i + 1) * n] for i, name in enumerate(("F0", "F1", "I1", "I0"))}
        if listed:
            plan["W"] = slots[4 * n:]
        assert peak(plan) == _walked_peak(plan), plan


# The squeeze as the paper states it, straight: every action in slot order tries each free slot
# from its inputs on and takes the first where its rank's whole peak (`peak`, the definition
# above) stays within the limit. v_squeeze.squeeze gets the same answer from levels it keeps.
def _straight_squeeze(plans: list[dict], warmup: bool) -> list[dict]:
    plans = [{name: list(slots) for name, slots in plan.items()} for plan in plans]
    limit = max(peak(plan) for plan in plans)
    last_rank, last_mb = len(plans) - 1, len(plans[0]["F0"]) - 1
    inputs = {"F0": lambda r, k: [plans[r - 1]["F0"][k]] if r else [],
              "F1": lambda r, k: [plans[r]["F0"][k]] + ([plans[r + 1]["F1"][k]] if r < last_rank else []),
              "I1": lambda r, k: [plans[r]["F1"][k]] + ([plans[r - 1]["I1"][k]] if r else []),
              "I0": lambda r, k: [plans[r]["I1"][k]] + ([plans[r + 1]["I0"][k]] if r < last_rank else []),
              "W": lambda r, k: [sorted(plans[r]["I1"] + plans[r]["I0"])[k]]}
    order = sorted((slot, rank, PASSES.index(name), k) for rank, plan in enumerate(plans)
                   for name, slots in plan.items() for k, slot in enumerate(slots))
    used = [set() for _ in plans]
    phase = "warm-up"
    for slot, rank, kind, k in order:
        name, plan = PASSES[kind], plans[rank]
        if phase == "warm-up" and name == "I0" and rank == 0:
            phase = "steady"
        if phase == "steady" and name == "F0" and k == last_mb:
            phase = "cool-down"
            used[rank].add(slot)
            continue
        if phase == "steady" or (phase == "warm-up" and not warmup):
            used[rank].add(slot)
            continue
        start = max(inputs[name](rank, k) + ([plan[name][k - 1]] if k else []), default=-1) + 1
        for earlier in range(start, slot):
            if earlier not in used[rank]:
                plan[name][k] = earlier
                if peak(plan) <= limit:
                    break
        else:
            plan[name][k] = slot
        used[rank].add(plan[name][k])
    return plans


def _random_plans(rng: random.Random, ranks: int, microbatches: int) -> list[dict]:
    """A random list schedule of the V's four passes: slot by slot, each rank runs one of its
    ready actions at random, or (now and then) nothing; then each W in the first hole after its
    backward, or (half the plans) in a random later one."""
    names = PASSES[:4]
    plans = [{name: [] for name in names} for _ in range(ranks)]
    needs = {"F0": lambda r, k: [(r - 1, "F0")] if r else [],
             "F1": lambda r, k: [(r, "F0")] + ([(r + 1, "F1")] if r < ranks - 1 else []),
             "I1": lambda r, k: [(r, "F1")] + ([(r - 1, "I1")] if r else []),
             "I0": lambda r, k: [(r, "I1")] + ([(r + 1, "I0")] if r < ranks - 1 else [])}
    idle = rng.choice([0.1, 0.4])
    slot = 0
    while any(len(plan[name]) < microbatches for plan in plans for name in names):
        for rank, plan in enumerate(plans):
            ready = [name for name in names if len(plan[name]) < microbatches
                     and all(len(plans[r][n]) > len(plan[name]) and plans[r][n][len(plan[name])] < slot
                             for r, n in needs[name](rank, len(plan[name])))]
            if ready and rng.random() > idle:
                plan[rng.choice(ready)].append(slot)
        slot += 1
    if rng.random() < 0.5:
        return [put_w_in_holes(plan) for plan in plans]
    for plan in plans:
        taken, plan["W"] = set(chain(*plan.values())), []
        for back in sorted(plan["I1"] + plan["I0"]):
            slot = max([back] + plan["W"][-1:]) + 1 + rng.choice([0, 0, 1, 3])
            while slot in taken:
                slot += 1
            plan["W"].append(slot)
            taken.add(slot)
    return plans


def test_the_squeeze_is_the_straight_one():
    """v_squeeze.squeeze (levels kept per slot) against `_straight_squeeze` (a whole peak per
    slot tried): random list schedules with and without their W's, and the V-Half and V-Min
    blocks, both squeezes; every slot of every action equal."""
    rng = random.Random(1)
    cases = [_random_plans(rng, rng.randint(2, 5), rng.randint(1, 8)) for _ in range(60)]
    cases += [[put_w_in_holes(plan) for plan in _block_plans(p, m, block)]
              for block in (v_half_block, v_min_block) for p, m in [(2, 5), (3, 7), (4, 8), (6, 9)]]
    for plans in cases:
        for warmup in (True, False):
            for given in (plans, [{name: plan[name] for name in PASSES[:4]} for plan in plans]):
                assert squeeze(given, warmup) == _straight_squeeze(given, warmup), (given, warmup)


def _straight_rank_actions(ranks: int, plans: list[dict]) -> list[list[pl.Action]]:
    """Slot by slot: each action where its plan puts it; each hole runs the oldest W owed on
    chunk 1, else on chunk 0; the W's still owed at the end follow, chunk 1's first."""
    acts = []
    for rank, plan in enumerate(plans):
        stage = {"F0": rank, "F1": 2 * ranks - 1 - rank, "I1": 2 * ranks - 1 - rank, "I0": rank}
        at = {slot: pl.Action(stage[name], name[0], mb) for name in PASSES[:4]
              for mb, slot in enumerate(plan[name])}
        up, down, row = [], [], []
        for slot in range(max(at) + 1):
            if slot in at:
                row.append(at[slot])
                if at[slot].kind == "I":
                    (up if at[slot].stage >= ranks else down).append(pl.Action(at[slot].stage, "W", at[slot].microbatch))
            elif up or down:
                row.append((up or down).pop(0))
        acts.append(row + up + down)
    return acts


def test_the_ws_fill_the_holes_as_the_straight_walk():
    """v_shape's W's in the holes (two queues in numpy) against the slot-by-slot walk, on
    random list schedules, where both chunks are often owed a W at one hole."""
    rng = random.Random(2)
    for _ in range(60):
        ranks = rng.randint(2, 5)
        plans = _random_plans(rng, ranks, rng.randint(1, 8))
        assert _rank_actions(ranks, plans) == _straight_rank_actions(ranks, plans), plans


def test_put_w_in_holes_is_the_slot_by_slot_walk():
    """Each backward owes a W; each free slot runs one owed W; the W's still owed at the end
    take the slots after the last action."""
    rng = random.Random(3)
    for _ in range(60):
        plan = _random_plans(rng, 1, rng.randint(1, 12))[0]
        taken, backwards = set(chain(*(plan[name] for name in PASSES[:4]))), set(plan["I1"] + plan["I0"])
        slots, owed = [], 0
        for slot in range(max(taken) + 1):
            if slot in backwards:
                owed += 1
            elif slot not in taken and owed:
                slots.append(slot)
                owed -= 1
        slots += range(max(taken) + 1, max(taken) + 1 + owed)
        assert put_w_in_holes(plan)["W"] == slots, plan
