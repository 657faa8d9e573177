"""zb-auto: the zero-bubble paper's automatic scheduler. It reproduces the authors' figures, is
never worse than ZB-H1 at ZB-H1's memory over a grid of F : I : W ratios, comes close to ZB-H2 at
ZB-H2's memory, respects its memory limit, and runs live with the unsplit model's gradients."""
from __future__ import annotations

import itertools

import pytest

import pipelab as pl
from pipelab.views import compare
from pipelab.chapters.write_your_own_schedule import memory_sweep

RATIOS = (0.5, 1.0, 2.0)
COMMS = (0.0, 0.3)
GRID = [pl.Costs(F=f, I=i, W=w, comm=c)
        for f, i, w in itertools.product(RATIOS, repeat=3) for c in COMMS]


def _run(p: int, m: int, costs: pl.Costs, limit: float, i_frees: float = 0.0):
    sched = pl.schedule("zb-auto", ranks=p, microbatches=m, costs=costs, memory_limit=limit,
                        i_frees=i_frees)
    return sched, pl.simulate(sched, costs, i_frees=i_frees)


@pytest.mark.parametrize("m,costs,limit,i_frees,span", [
    (8, pl.Costs(), 4, 0.0, 27.0),                        # = ZB-H1 (1F1B: 33)
    (8, pl.Costs(), 7, 0.0, 24.0),                        # = ZB-H2: no bubble
    (8, pl.Costs(F=1, I=1.5, W=0.5), 7, 0.5, 28.0),       # beats ZB-H2's 28.5
    (12, pl.Costs(F=1, I=1.5, W=0.5), 7, 0.5, 38.0),      # beats ZB-H2's 40.5 ...
    (12, pl.Costs(F=1, I=1.5, W=0.5), 7, 0.0, 40.5),      # ... only if I frees half (M_W = M_B/2)
])
def test_reproduces_the_authors_runs(m, costs, limit, i_frees, span):
    """The spans the authors' heuristic (their code, run at p = 4) gives."""
    _sched, tl = _run(4, m, costs, limit, i_frees)
    assert compare.longest_span(tl) == pytest.approx(span)


@pytest.mark.parametrize("p,m", [(3, 6), (4, 8)])
@pytest.mark.parametrize("i_frees", [0.0, 0.5])
def test_never_worse_than_zb_h1_and_close_to_zb_h2_at_their_memory(p, m, i_frees):
    """Over the F : I : W grid (27 ratios, with and without message latency), zb-auto given
    the peak memory ZB-H1 reaches (p, in our convention for either I/W split) never has a
    longer span than ZB-H1 (mostly equal: the authors saw the same); given ZB-H2's (2p − 1),
    it is within 3% of ZB-H2's span and shorter somewhere (ZB-H2's fixed rhythm fits only
    F = I = W). Neither goes above its limit. (With messages as slow as a forward, comm = 1,
    the heuristic — the authors' too — falls up to 5.5% behind ZB-H2.)"""
    rows = memory_sweep.ratio_grid(p, m, RATIOS, COMMS, i_frees=i_frees)
    assert {(r["F"], r["I"], r["W"], r["comm"]) for r in rows} == \
        set(itertools.product(RATIOS, RATIOS, RATIOS, COMMS))
    gaps = []
    for row in rows:
        assert row["h1"]["peak"] == row["auto_p"]["limit"] == p
        assert row["h2"]["peak"] == row["auto_2p1"]["limit"] == 2 * p - 1
        assert row["auto_p"]["peak"] <= p + 1e-9 and row["auto_2p1"]["peak"] <= 2 * p - 1 + 1e-9
        assert row["auto_p"]["span"] <= row["h1"]["span"] + 1e-9, row
        gaps.append(row["auto_2p1"]["span"] / row["h2"]["span"] - 1)
    assert max(gaps) <= 0.03 and min(gaps) < 0, (max(gaps), min(gaps))


@pytest.mark.parametrize("p,m", [(3, 6), (4, 8)])
def test_one_more_microbatch_of_memory_buys_time(p, m):
    """Where ZB-H1 has no answer: at p + 1 the span is shorter than ZB-H1's on most of the grid."""
    h1_sched = pl.schedule("zb-h1", ranks=p, microbatches=m)
    better = sum(compare.longest_span(_run(p, m, costs, p + 1)[1])
                 < compare.longest_span(pl.simulate(h1_sched, costs)) - 1e-9 for costs in GRID)
    assert better >= len(GRID) // 2


@pytest.mark.parametrize("limit", [1, 2.5, 5.5])
@pytest.mark.parametrize("i_frees", [0.0, 0.3, 1.0])
def test_memory_limit_holds_and_buys_time(limit, i_frees):
    """Peak activations (the simulator's count, same units) never exceed the limit; more memory
    never makes the span longer."""
    costs = pl.Costs(F=1, I=1.25, W=0.75, comm=0.1)
    _sched, tl = _run(4, 8, costs, limit, i_frees)
    assert max(tl.peak_activations().values()) <= limit + 1e-9
    _sched, roomier = _run(4, 8, costs, limit + 2, i_frees)
    assert compare.longest_span(roomier) <= compare.longest_span(tl) + 1e-9


def test_per_stage_costs_and_text_round_trip():
    """A slow last stage (a head with the vocabulary): still valid, and its text reads back."""
    costs = pl.Costs(F=[1, 1, 1, 2], I=[1, 1, 1, 2.5], W=[1, 1, 1, 1.5], comm=0.2)
    sched, tl = _run(4, 8, costs, 4)
    h1 = pl.simulate(pl.schedule("zb-h1", ranks=4, microbatches=8), costs)
    assert compare.longest_span(tl) <= compare.longest_span(h1)
    again = pl.Schedule.from_text(sched.to_text()).validate()
    assert again.actions == sched.actions and again.name == "zb-auto"


# Costs fitted from a live ZB-H1 run (p = 4, m = 8, d_model 128; ms): uneven stages, a fast
# head, W about half of I, a message of 59 µs. Fixed here so the check is not the machine's load.
FITTED = pl.Costs(F=[2.09, 2.62, 2.22, 1.52], I=[2.08, 2.88, 1.93, 1.14],
                  W=[1.05, 1.49, 1.06, 0.54], comm=0.059)


@pytest.mark.parametrize("i_frees", [0.0, 0.063])      # the paper's convention / our measured one
def test_on_costs_fitted_from_a_live_run(i_frees):
    """The issue's bar on real costs: at ZB-H1's memory a span no longer than ZB-H1's, at
    ZB-H2's no longer than ZB-H2's, and each microbatch of memory between them buys time."""
    def span(sched):
        return compare.longest_span(pl.simulate(sched, FITTED, i_frees=i_frees))
    auto = [span(_run(4, 8, FITTED, k, i_frees)[0]) for k in (4, 5, 6, 7)]
    assert auto[0] <= span(pl.schedule("zb-h1", ranks=4, microbatches=8))
    assert auto[3] <= span(pl.schedule("zb-h2", ranks=4, microbatches=8))
    assert auto[0] > auto[1] > auto[2], auto


@pytest.mark.parametrize("costs", [GRID[5], GRID[-1], pl.Costs(F=8, I=12, W=4, comm=0.5, per="batch"),
                                   pl.Costs(F=[1, 2, 1, 1.5], I=[2, 1, 1, 1], W=[0.5, 1, 2, 1],
                                            comm=0.25)])
def test_the_greedy_clock_is_the_simulators(costs):
    """zb-auto picks among its eight variants by the times it placed their ops at; those must be
    the times the simulator finds for the same order, or it would pick on wrong numbers."""
    from pipelab.schedules import zb_auto
    table, comm = zb_auto._cost_table(costs, 4, 8)
    for choice in itertools.product((True, False), repeat=3):
        greedy = zb_auto._Greedy(4, 8, table, comm, 5.0, 0.25, dict(zip(zb_auto.FLAGS, choice)))
        greedy.run()
        sched = pl.Schedule(greedy.order, placement=range(4), microbatches=8).validate()
        tl = pl.simulate(sched, costs, i_frees=0.25)
        assert greedy.score() == pytest.approx((compare.longest_span(tl), tl.makespan))
        assert max(tl.peak_activations().values()) <= 5 + 1e-9


@pytest.mark.parametrize("options,words", [
    ({"memory_limit": 0.5}, "memory_limit must be a finite number >= 1"),
    ({"memory_limit": float("inf")}, "memory_limit must be a finite number >= 1"),
    ({"memory_limit": "4"}, "memory_limit"),
    ({"costs": {"F": 1}}, "costs must be a pl.Costs"),
    ({"costs": pl.Costs(F=[1, 2])}, "costs.F has 2 per-stage values"),
    ({"i_frees": 1.5}, "i_frees must be a number between 0 and 1"),
    ({"chunks": 2}, "does not take option"),
])
def test_bad_options_say_which_and_why(options, words):
    with pytest.raises(ValueError, match=words):
        pl.schedule("zb-auto", ranks=4, microbatches=8, **options)


CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)


def test_live_from_fitted_costs_is_exact(clusters):
    """The workflow of the paper's runtime: run ZB-H1, fit F, I, W and the message latency from
    the measured run (and the share of activations I frees), build zb-auto from them, run it:
    the unsplit model's loss and gradients, within the memory limit it was given."""
    p, m = 3, 6
    cluster = clusters(p)
    first = cluster.run(pl.schedule("zb-h1", ranks=p, microbatches=m), model=CFG, seed=3)
    costs = compare.fit_costs(first)
    assert isinstance(costs.F, list) and len(costs.F) == p and costs.comm >= 0
    sched = pl.schedule("zb-auto", ranks=p, microbatches=m, costs=costs, memory_limit=p,
                        i_frees=first.i_frees)
    res = cluster.run(sched, model=CFG, seed=3)
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    for rank in range(p):
        assert [e.action for e in res.timeline.events_of(rank)] == sched.actions[rank]
    peaks = pl.simulate(sched, costs, i_frees=first.i_frees).peak_activations()
    assert max(peaks.values()) <= p + 1e-9
