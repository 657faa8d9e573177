"""Interleaved 1F1B, looped BFS and the zero-bubble family against the closed forms of
docs/formulas.md (Megatron SC21 §2.2.2; Qi et al. ICLR 2024 Table 2 and §6).

Costs: T_F, T_I, T_W are per microbatch per *rank's worth of layers*, as a `pl.Costs` holds them;
with v chunks per rank the simulator charges each chunk stage 1/v of that. Activation counts are in the
simulator's microbatch-stage units (one chunk forward = 1/v), with i_frees=0 (W frees all).
"""
import re

import pytest

import pipelab as pl
from pipelab.schedules import Action, Schedule, ScheduleError

UNIT = pl.Costs(F=1.0, I=1.0, W=1.0)
NEW = ["interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v"]
RANKS = range(2, 7)


def spans(tl) -> dict[int, float]:
    """Per-rank span, the zero-bubble papers' convention: first start to last end on each rank."""
    return {r: max(e.end for e in tl.events_of(r)) - min(e.start for e in tl.events_of(r))
            for r in range(tl.ranks)}


def smallest_m(name: str, p: int) -> int:
    return 2 * p - 1 if name in ("zb-h2", "zb-v") else 1


def build(name: str, p: int, m: int) -> Schedule:
    return pl.schedule(name, ranks=p, microbatches=m)


# --- docs/formulas.md's reference table (unit costs, p, m) ------------------------------------

@pytest.mark.parametrize("p,m,makespan", [(4, 4, 16.5), (4, 8, 28.5), (8, 16, 58.5), (8, 32, 106.5)])
def test_interleaved_reference_values(p, m, makespan):
    tl = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=2),
                     UNIT)
    assert tl.makespan == pytest.approx(makespan)
    if (p, m) == (4, 8):
        peaks = tl.peak_activations()
        assert peaks[0] == pytest.approx(5.5) and peaks[3] == pytest.approx(2.5)


@pytest.mark.parametrize("p,m,makespan", [(4, 4, 15), (4, 8, 27), (8, 16, 55), (8, 32, 103)])
def test_zb_h1_reference_values(p, m, makespan):
    tl = pl.simulate(build("zb-h1", p, m), UNIT)
    assert tl.makespan == pytest.approx(makespan)
    assert tl.peak_activations()[0] == p        # the same as 1F1B's first rank


def test_zb_h2_span_and_wall_clock_differ_as_formulas_md_says():
    tl = pl.simulate(build("zb-h2", 4, 8), UNIT)
    assert max(spans(tl).values()) == 24 and tl.makespan == 27


# --- interleaved 1F1B ---------------------------------------------------------------------------

@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_one_over_v_of_1f1b(v):
    """Makespan m(T_F+T_B) + (p−1)(T_F+T_B)/v for every m ≥ p the round rule accepts — also
    when m is not a multiple of p (equal rounds of g ≥ p microbatches)."""
    costs = pl.Costs(F=1.0, I=1.5, W=0.5)          # T_F = 1, T_B = 2, uneven I/W split
    checked = 0
    for p in RANKS:
        for m in range(p, 4 * p + 1):
            if m % max(1, m // p):
                continue
            tl = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v), costs)
            assert tl.makespan == pytest.approx(3 * m + 3 * (p - 1) / v), (p, m, v)
            checked += 1
    assert checked > 40          # the sweep did run (44 accepted (p, m) pairs)


@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_peak_activations(v):
    """Rank r holds 2(p−1−r) + (v−1)p + 1 chunk forwards when m is a multiple of p and m ≥ 2p:
    p + (p−1)/v on the first rank, p − (p−1)/v on the last (Korthikanti et al. §4.2.3)."""
    for p in RANKS:
        for m in range(2 * p, 5 * p + 1, p):
            peaks = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v),
                                UNIT).peak_activations()
            assert peaks[0] == pytest.approx(p + (p - 1) / v), (p, m)
            assert peaks[p - 1] == pytest.approx(p - (p - 1) / v), (p, m)
            for r in range(p):
                assert peaks[r] == pytest.approx(p + (p - 1 - 2 * r) / v), (p, m, r)


@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_with_fewer_microbatches_than_ranks_cannot_fill_the_loop(v):
    """m < p: one round of m microbatches, and chunk c+1 waits for microbatch 0 to come round
    the ranks: a plain pipeline p·v stages deep, (p·v + m − 1)(T_F + T_B)/v, as looped BFS."""
    for p in RANKS:
        for m in range(1, p):
            tl = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v),
                             UNIT)
            assert tl.makespan == pytest.approx((p * v + m - 1) * 3 / v), (p, m)


@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_peak_with_rounds_of_more_than_p(v):
    """With rounds of g = m / max(1, m // p) microbatches the warm-up runs (v−1)·g forwards
    before the first backward can come back, so rank r peaks at (2(p−1−r) + (v−1)g + 1)/v."""
    checked = 0
    for p in RANKS:
        for m in range(2 * p, 5 * p + 1):
            rounds = m // p
            if m % rounds or m % p == 0:
                continue
            g = m // rounds
            peaks = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v),
                                UNIT).peak_activations()
            assert peaks == {r: pytest.approx((2 * (p - 1 - r) + (v - 1) * g + 1) / v)
                             for r in range(p)}, (p, m)
            checked += 1
    assert checked >= 5         # e.g. p=4, m=10: two rounds of 5


def test_interleaved_with_one_chunk_is_1f1b():
    for p in range(1, 7):
        for m in range(1, 13):
            one = pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=1)
            ref = pl.schedule("1f1b", ranks=p, microbatches=m)
            assert one.actions == ref.actions and one.placement == ref.placement, (p, m)


def test_interleaved_reads_as_rounds_through_the_chunks():
    sched = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    assert sched.placement == (0, 1, 0, 1)
    # Warm-up on rank 0: a round through chunk 0, the same round through chunk 1, then 2 more.
    assert " ".join(map(str, sched.actions[0][:6])) == "0F0 0F1 2F0 2F1 0F2 2B0"
    assert " ".join(map(str, sched.actions[1][:4])) == "1F0 1F1 3F0 3B0"


def test_interleaved_uneven_rounds_are_accepted_when_equal():
    # p=4, m=10: two rounds of 5; m=6: one round of 6 (torch's flexible rule).
    for m in (6, 10):
        sched = pl.schedule("interleaved-1f1b", ranks=4, microbatches=m, chunks=2)
        assert len(sched) == 2 * 2 * 4 * m


# --- looped BFS -------------------------------------------------------------------------------

@pytest.mark.parametrize("v", [2, 3])
def test_looped_bfs_bubble_and_memory_from_first_principles(v):
    """Breadth first, every forward of a chunk back to back: once m ≥ p the loop never stalls,
    so the ranks' work is m·v(f+b) and only the pipeline's fill and drain, (p−1)(f+b), is idle,
    f = T_F/v and b = T_B/v: the same bubble as interleaved. When m < p each chunk waits for
    microbatch 0 to come round: the pipeline is p·v stages deep, (p·v + m − 1)(f+b).
    Every rank holds all m microbatches' activations of all v chunks at the turn: m."""
    costs = UNIT
    f_plus_b = 3.0 / v
    for p in RANKS:
        for m in range(1, 3 * p + 1):
            tl = pl.simulate(pl.schedule("looped-bfs", ranks=p, microbatches=m, chunks=v), costs)
            assert tl.makespan == pytest.approx((v * max(m, p) + min(m, p) - 1) * f_plus_b), (p, m)
            assert tl.peak_activations() == {r: pytest.approx(m) for r in range(p)}


def test_looped_bfs_reads_as_whole_chunks():
    sched = pl.schedule("looped-bfs", ranks=2, microbatches=2, chunks=2)
    assert " ".join(map(str, sched.actions[0])) == "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1"
    assert sched.placement == (0, 1, 0, 1)


def test_looped_bfs_holds_more_than_depth_first():
    for p in RANKS:
        for m in range(2 * p, 5 * p + 1, p):
            bfs = pl.simulate(pl.schedule("looped-bfs", ranks=p, microbatches=m), UNIT)
            dfs = pl.simulate(pl.schedule("interleaved-1f1b", ranks=p, microbatches=m), UNIT)
            assert bfs.makespan == pytest.approx(dfs.makespan)          # same bubble …
            for r in range(p):                                           # … more memory
                assert bfs.peak_activations()[r] > dfs.peak_activations()[r], (p, m, r)


# --- zero bubble --------------------------------------------------------------------------------

# Costs where the closed forms are meant to hold (T_W no larger than T_F and T_I).
ZB_COSTS = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0)]


@pytest.mark.parametrize("F,I,W", ZB_COSTS)
def test_zb_h1_bubble(F, I, W):  # noqa: E741
    """m(T_F+T_I+T_W) + (p−1)(T_F+T_I−T_W) for m ≥ p, wall-clock and per-rank span alike
    (every rank ends at the same time, having started i steps late); 1F1B's memory: p."""
    for p in RANKS:
        for m in range(p, 4 * p + 1):
            tl = pl.simulate(build("zb-h1", p, m), pl.Costs(F=F, I=I, W=W))
            expected = m * (F + I + W) + (p - 1) * (F + I - W)
            assert tl.makespan == pytest.approx(expected), (p, m)
            assert max(spans(tl).values()) == pytest.approx(expected), (p, m)
            assert tl.peak_activations() == {r: p for r in range(p)}, (p, m)


def test_zb_memory_depends_on_what_i_frees():
    """With W freeing everything (i_frees=0) every rank peaks at p (ZB-H1) or 2p−1 (ZB-H2);
    if I freed everything (i_frees=1) the deferred W's would cost nothing: ZB-H1 holds exactly
    what 1F1B holds (p−i) and ZB-H2 its warm-up plus one, 2(p−1−i)+1. The first rank's peak
    does not depend on the split."""
    for p in RANKS:
        m = 3 * p
        h1, h2 = build("zb-h1", p, m), build("zb-h2", p, m)
        for i_frees in (0.0, 0.5, 1.0):
            assert pl.simulate(h1, UNIT, i_frees=i_frees).peak_activations()[0] == p
            assert pl.simulate(h2, UNIT, i_frees=i_frees).peak_activations()[0] == 2 * p - 1
        assert pl.simulate(h1, UNIT, i_frees=1.0).peak_activations() == {i: p - i for i in range(p)}
        assert pl.simulate(h2, UNIT, i_frees=1.0).peak_activations() == \
            {i: 2 * (p - 1 - i) + 1 for i in range(p)}


def test_zb_h1_beats_1f1b_at_its_memory_even_when_m_is_small():
    for p in RANKS:
        for m in range(1, p):
            zb = pl.simulate(build("zb-h1", p, m), UNIT)
            ofob = pl.simulate(build("1f1b", p, m), UNIT)
            assert zb.makespan < ofob.makespan
            assert max(zb.peak_activations().values()) <= max(ofob.peak_activations().values())


@pytest.mark.parametrize("F,I,W", ZB_COSTS)
def test_zb_h2_bubble_on_the_per_rank_span(F, I, W):  # noqa: E741
    """Longest per-rank span = m(T_F+T_I+T_W) + (p−1)(T_F+T_I−2T_W) (0 bubble when F = I = W);
    the wall-clock makespan adds the last rank's late start. Peak 2p−1 on the first rank."""
    for p in RANKS:
        for m in range(2 * p - 1, 4 * p + 1):
            tl = pl.simulate(build("zb-h2", p, m), pl.Costs(F=F, I=I, W=W))
            span = max(spans(tl).values())
            assert span == pytest.approx(m * (F + I + W) + (p - 1) * (F + I - 2 * W)), (p, m)
            if F == I == W:
                assert tl.makespan == pytest.approx(span + (p - 1) * F)
            peaks = tl.peak_activations()
            assert peaks[0] == 2 * p - 1 and max(peaks.values()) == 2 * p - 1, (p, m)


def test_zb_h2_beats_zb_h1_by_the_w_it_hides():
    for p in RANKS:
        m = 3 * p
        h1 = max(spans(pl.simulate(build("zb-h1", p, m), UNIT)).values())
        h2 = max(spans(pl.simulate(build("zb-h2", p, m), UNIT)).values())
        assert h1 - h2 == pytest.approx(p - 1)


def test_zb_v_has_no_bubble_per_rank_span_at_equal_costs():
    """With T_F = T_I = T_W (a rank's worth; each chunk costs half), every rank's span is exactly
    its work, m(T_F+T_I+T_W): no idle time between its first forward and its last W. What
    remains is wall-clock only: rank r starts r chunk-forwards late, so the makespan is the span
    plus (p−1)·T_F/2. Peak activations p on every rank (1F1B's first rank), whatever share of
    the activations I frees: where a rank peaks, each I is followed by its W."""
    for p in range(1, 7):
        for m in range(2 * p - 1, 4 * p + 1):
            sched = build("zb-v", p, m)
            tl = pl.simulate(sched, UNIT)
            assert spans(tl) == {r: pytest.approx(3 * m) for r in range(p)}, (p, m)
            assert tl.makespan == pytest.approx(3 * m + (p - 1) / 2), (p, m)
            for i_frees in (0.0, 0.5, 1.0):
                peaks = pl.simulate(sched, UNIT, i_frees=i_frees).peak_activations()
                assert peaks == {r: pytest.approx(p) for r in range(p)}, (p, m, i_frees)


def test_zb_v_is_v_shaped_and_rejects_other_chunk_counts():
    sched = pl.schedule("zb-v", ranks=3, microbatches=5, chunks=2)
    assert sched.placement == (0, 1, 2, 2, 1, 0) and sched.chunks == 2
    assert sched.actions == build("zb-v", 3, 5).actions


# --- every new schedule: sound, round-trips, broken copies rejected -----------------------------

def allowed(name: str, p: int, m: int) -> bool:
    if name == "interleaved-1f1b":
        return m % max(1, m // p) == 0
    return m >= smallest_m(name, p)


CASES = [(name, p, m) for name in NEW for p in (1, 2, 3, 4, 6)
         for m in sorted({smallest_m(name, p), p + 1, 2 * p, 2 * p + 1, 3 * p})
         if allowed(name, p, m)]


@pytest.mark.parametrize("name,p,m", CASES)
def test_text_and_csv_round_trip(name, p, m, tmp_path):
    sched = build(name, p, m)
    again = Schedule.from_text(sched.to_text())
    assert again.actions == sched.actions and again.placement == sched.placement
    assert again.microbatches == m and again.name == name
    path = tmp_path / "s.csv"
    sched.to_csv(path)
    # A CSV carries no header: the placement comes back from which rank runs which stage.
    from_csv = Schedule.from_csv(path, microbatches=m)
    assert from_csv.actions == sched.actions and from_csv.placement == sched.placement
    from_csv.validate()


def _first(acts, pred):
    return next(i for i, a in enumerate(acts) if pred(a))


@pytest.mark.parametrize("name", NEW)
def test_backward_moved_before_its_forward_is_rejected(name):
    sched = build(name, 3, 6)
    rank = 2
    acts = sched.actions[rank]
    i = _first(acts, lambda a: a.kind in ("B", "I"))
    moved = acts.pop(i)
    acts.insert(0, moved)
    with pytest.raises(ScheduleError) as info:
        sched.validate()
    message = str(info.value)
    assert f"runs {moved} at step 0, before" in message
    assert f">{moved}<" in message and "step |" in message


@pytest.mark.parametrize("name", NEW)
def test_forward_delayed_past_the_first_backward_deadlocks(name):
    """Rank 0 sends 0F1 only after its first backward, which waits for the later stages'
    backward of microbatch 0, which rank 1 runs only after it has forwarded 0F1's output."""
    sched = build(name, 3, 6)
    acts = sched.actions[0]
    forward = acts.pop(acts.index(Action(0, "F", 1)))
    acts.insert(_first(acts, lambda a: a.kind in ("B", "I")) + 1, forward)
    with pytest.raises(ScheduleError) as info:
        sched.validate()
    message = str(info.value)
    assert "deadlock: no rank can make progress" in message and "waits for 0F1" in message
    assert re.search(r">\d+[FBIW]\d+<", message), message      # the stuck steps are marked


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-v"])
def test_a_dropped_w_is_rejected(name):
    sched = build(name, 3, 6)
    dropped = sched.actions[1].pop(_first(sched.actions[1], lambda a: a.kind == "W"))
    with pytest.raises(ScheduleError) as info:
        sched.validate()
    message = str(info.value)
    assert f"{dropped} is missing: a split backward needs both" in message
    assert "<--" in message and "step |" in message


# --- options and constraints ------------------------------------------------------------------

def test_chunks_must_be_a_positive_integer():
    for name in ("interleaved-1f1b", "looped-bfs"):
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match=f"{name}: chunks must be a positive integer"):
                pl.schedule(name, ranks=2, microbatches=4, chunks=bad)


def test_interleaved_refuses_unequal_rounds():
    with pytest.raises(ValueError) as info:
        pl.schedule("interleaved-1f1b", ranks=3, microbatches=7, chunks=2)
    message = str(info.value)
    assert "interleaved-1f1b needs the microbatches to split into equal rounds" in message
    assert "7 microbatches on 3 ranks make 2 rounds of 3.5" in message
    # 8 is no multiple of 3 but splits into 2 rounds of 4: the message offers both rules.
    assert "Use a multiple of 3 (Megatron's rule) or another count that splits evenly" in message
    assert "e.g. 6 or 8" in message


@pytest.mark.parametrize("name", ["zb-h2", "zb-v"])
def test_zero_bubble_needs_2p_minus_1_microbatches(name):
    with pytest.raises(ValueError, match=rf"{name} needs microbatches >= 2\*ranks - 1 = 7 with 4 "
                                         r"ranks, got 6: "):
        pl.schedule(name, ranks=4, microbatches=6)
    pl.schedule(name, ranks=4, microbatches=7)


def test_zb_v_refuses_chunks_other_than_two():
    for bad in (1, 3, 0):
        with pytest.raises(ValueError, match=rf"zb-v has exactly 2 chunks per rank \(the V "
                                             rf"placement.*got chunks={bad}; leave chunks out"):
            pl.schedule("zb-v", ranks=2, microbatches=4, chunks=bad)


def test_zb_h_schedules_take_no_chunks():
    for name in ("zb-h1", "zb-h2"):
        with pytest.raises(ValueError, match=f"{name} does not take option"):
            pl.schedule(name, ranks=2, microbatches=4, chunks=2)


def test_registered_names():
    assert set(NEW) <= set(pl.SCHEDULES)
