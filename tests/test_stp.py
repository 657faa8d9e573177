"""The STP schedule against the authors' order, and the simulator's tensor-parallel all-reduce
against the closed forms of docs/formulas.md (STP, 1F1B-I, ZB-V) on unit costs. The STP paper's
T_F, T_I, T_W and T_AR are one chunk's (a stage's): the tables here are `pl.Costs.per_stage`."""
from __future__ import annotations

import pytest

import pipelab as pl
from pipelab.sim.tensor_overlap import bubbles

# The authors' order at p=2, m=5 (their STPSchedule.generate): the instruction starting each step.
PAPER = {0: "F F F F F FBd FW FB B FBd B FBd B B B W W B",
         1: "F F F F FF FB FB FBd B FBd B B B B B W W"}


def instruction(item) -> str:
    kinds = [p.kind for p in item.parts]
    return {("F",): "F", ("B",): "B", ("W",): "W", ("F", "F"): "FF", ("F", "B"): "FB",
            ("F", "I"): "FBd", ("F", "W"): "FW"}[tuple(kinds)]


def test_stp_is_the_authors_order():
    s = pl.schedule("stp", ranks=2, microbatches=5)
    for rank, row in PAPER.items():
        assert " ".join(map(instruction, s.actions[rank])) == row
    # Deferred W's run oldest first (a FIFO), and chunk 1 of rank 0 is the last stage.
    assert str(s.actions[0][6]) == "0F4+3W0" and s.rank_of(3) == 0


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_braided_steps_pair_microbatches_with_the_papers_lags(p):
    m = 3 * p + 1
    s = pl.schedule("stp", ranks=p, microbatches=m)
    for r, acts in enumerate(s.actions):
        for item in acts:
            f, other = item.parts[0], item.parts[-1]
            if len(item.parts) == 2 and other.kind in "BI":
                chunk1 = f.stage == 2 * p - 1 - r
                assert f.microbatch - other.microbatch == (r + 1 if chunk1 else 3 * p - 1 - r)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_stp_idles_p_minus_1_units_per_rank_at_unit_costs(p):
    for m in (3 * p - 1, 3 * p + 2):
        tl = pl.simulate(pl.schedule("stp", ranks=p, microbatches=m),
                         pl.Costs.per_stage(F=1, I=1, W=1))
        assert tl.makespan == 6 * m + p - 1


def test_stp_refuses_too_few_microbatches_and_other_chunk_counts():
    with pytest.raises(ValueError, match="microbatches >= 3\\*ranks - 1 = 8"):
        pl.schedule("stp", ranks=3, microbatches=7)      # ≥ 2p, which the authors' code allows
    with pytest.raises(ValueError, match="exactly 2 chunks"):
        pl.schedule("stp", ranks=2, microbatches=5, chunks=3)


def tp_bubbles(name, p, m, a, **options):
    costs = pl.Costs.per_stage(F=1, I=1, W=1, tp_allreduce=a, **options)
    return bubbles(pl.simulate(pl.schedule(name, ranks=p, microbatches=m), costs), costs)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_stp_tp_bubble_is_2p_plus_1_all_reduces(p):
    a = 0.25
    b = tp_bubbles("stp", p, 3 * p + 1, a)
    assert b[0]["tp"] == pytest.approx((2 * p + 1) * a)
    # rank r waits for 2(p−r−1) + 2(r+1) + [r+1 odd] standalone forwards: 2p + [r even]
    assert [b[r]["tp"] / a for r in range(p)] == pytest.approx([2 * p + (r % 2 == 0)
                                                              for r in range(p)])
    # Without async overlap every forward and input-gradient all-reduce is waited for: 4m.
    assert tp_bubbles("stp", p, 3 * p + 1, a, tp_overlap=False)[0]["tp"] == \
        pytest.approx(4 * (3 * p + 1) * a)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_stp_total_overhead_idealised_and_with_sends_waiting(p):
    """Rank 0's span beyond its 6m units of compute. The papers' accounting (a braided step's
    last all-reduce is free) gives (p−1) + (3p−1)a for even p and (p−1) + 3p·a for odd p (the
    README's PP + TP sum); when what a braided step sends waits for that all-reduce, as it
    must at run time, (p−1) + (7p−4)a."""
    a, m = 0.25, 3 * p + 1
    ideal = tp_bubbles("stp", p, m, a, tp_sends_wait=False)[0]
    assert ideal["span"] - 6 * m == pytest.approx((p - 1) + (3 * p - (p % 2 == 0)) * a)
    real = tp_bubbles("stp", p, m, a)[0]
    assert real["span"] - 6 * m == pytest.approx((p - 1) + (7 * p - 4) * a)
    # The PP formula (p−1)(T_F+T_AR+T_I−T_W) holds exactly in the idealised order for odd p.
    if p % 2:
        assert ideal["pp"] == pytest.approx((p - 1) * (1 + a + 1 - 1))


@pytest.mark.parametrize("p", [2, 3, 4])
def test_1f1b_i_and_zb_v_rows(p):
    a = 0.25
    inter = tp_bubbles("interleaved-1f1b", p, 2 * p, a)[0]     # the paper's 1F1B-I
    assert inter["tp"] == pytest.approx(2 * (2 * p) * a)                 # 2m·T_AR
    assert inter["pp"] == pytest.approx((p - 1) * (1 + a + 1 + 1))       # (p−1)(F+AR+I+W)
    m = 3 * p + 1
    zbv = tp_bubbles("zb-v", p, m, a)[0]
    assert zbv["tp"] == pytest.approx(4 * m * a)                         # 4m·T_AR
    assert zbv["pp"] == pytest.approx((p - 1) * (1 + 2 * a + 1 - 2))     # (p−1)(F+2AR+I−2W)


def test_simulated_timelines_draw_the_all_reduces_on_the_communication_lane():
    s = pl.schedule("stp", ranks=2, microbatches=5)
    tl = pl.simulate(s, pl.Costs.per_stage(F=1, I=1, W=1, tp_allreduce=0.25))
    ars = tl.comm_events()
    assert len(ars) == 2 * 2 * 2 * 5 and {e.action.kind for e in ars} == {"Tp"}   # F and I/B
    assert not pl.simulate(s, pl.Costs.per_stage(F=1, I=1, W=1)).comm_events()


def test_a_tail_holds_back_what_a_step_sends_not_what_stays_on_the_rank():
    s = pl.schedule("stp", ranks=2, microbatches=5)
    tl = pl.simulate(s, pl.Costs.per_stage(F=1, I=1, W=1, tp_allreduce=0.25))
    at = {str(e.action): e for e in tl.events if e.action.kind != "Tp"}
    # 3F1+3I0 computes until 8.25; its I's all-reduce (the tail) ends at 8.5.
    assert at["3F1+3I0"].end == 8.25
    assert at["0F4+3W0"].start == 8.25          # W reads state kept on rank 0: no wait
    assert at["2F2+2B0"].start == 8.5           # rank 1's B needs the summed gradient
