"""V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024):
their bubbles against the authors' generator, their peaks against the paper's closed forms, the
orderings the paper's figure makes, and live runs that compute the unsplit model exactly.

Units: costs are a rank's worth of layers (a chunk costs half); peaks count microbatches of a
rank's layers (a chunk forward holds ½). Simulated unless the test says live."""
from __future__ import annotations

import random

import pytest

import pipelab as pl
from pipelab.sim.compare import longest_span
from pipelab.schedules.v_shape import INTERVAL, block_actions, v_half_block, v_min_block
from pipelab.schedules.v_squeeze import peak

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
