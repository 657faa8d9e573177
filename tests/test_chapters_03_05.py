"""Notebooks 03-05's chapter helpers: the numbered critical-path crossings and their round trips,
the V schedules' building blocks, and the live round a chart draws."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import pipelab as pl
from pipelab.chapters import critical_path, zero_bubble
from pipelab.views import compare


@pytest.mark.parametrize("p", [3, 5])          # at p = 2 a trip that "turns one rank short" has no way up
def test_crossings_are_the_path_summarys_and_form_m_over_p_plus_one_round_trips(p):
    m = 2 * p
    tl = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), pl.Costs(comm=0.5))
    found = critical_path.crossings(tl)
    assert len(found) == tl.path_summary().crossings == 2 * (p - 1) * (m // p + 1) - 2
    assert [c.number for c in found] == list(range(1, len(found) + 1))
    assert len(critical_path.round_trips(found)) == m // p + 1


def test_a_loop_goes_down_by_stage_not_by_rank():
    tl = compare.simulate_named("interleaved-1f1b", 4, 8, pl.Costs(comm=0.1), chunks=2)
    trips = critical_path.round_trips(critical_path.crossings(tl))
    assert [(sum(c.down for c in t), sum(not c.down for c in t)) for t in trips] == [(7, 7)]


@pytest.mark.parametrize("p", [3, 4, 6, 8])
def test_building_block_gaps_are_the_block_tables_closed_forms(p):
    blocks = zero_bubble.building_blocks(p)
    g_half, g_min = (3 if p % 2 == 0 else 0), (2 if p % 3 == 0 else 0)
    for r in range(p):
        assert blocks["zb-v"].gaps(r) == 12 * p - 4 and blocks["zb-v"].lifespans(r) == 12 * p
        assert blocks["v-half"].gaps(r) == 6 * p + 2 * g_half - 1
        assert blocks["v-min"].gaps(r) == 4 * p + 2 * g_min
        # "peak ≈ lifespans / 12" is an estimate: within ½ up to p = 6; at p = 8 V-Min's busier
        # ranks hold 4 where one microbatch's lifespans give 3.
        for block in blocks.values():
            assert abs(block.peaks[r] - block.lifespans(r) / 12) <= (0.5 if p <= 6 else 1.0), (block.name, r)


def test_building_blocks_refuse_a_run_too_short_for_a_steady_state():
    with pytest.raises(ValueError, match="microbatches must be at least 3\\*ranks"):
        zero_bubble.building_blocks(4, microbatches=8)


def _runs(*makespans):
    return [SimpleNamespace(replay=SimpleNamespace(makespan=t), timeline=SimpleNamespace(makespan=2 * t))
            for t in makespans]


def test_median_round_is_the_round_of_the_median_saving_not_of_each_sides_median():
    # savings 1, 4, .5, 3, .5: the median saving is round 0's; round 3 holds base's median (11)
    base, new = _runs(10, 12, 20, 11, 9), _runs(9, 8, 19.5, 8, 8.5)
    k = zero_bubble.median_round(base, new)
    assert k == 0
    assert base[k].replay.makespan - new[k].replay.makespan == zero_bubble.median_saving(base, new) == 1
    assert zero_bubble.median_round(base, new, view="timeline") == 0
    with pytest.raises(ValueError, match="pair up"):
        zero_bubble.median_round(base, new[:-1])
    with pytest.raises(ValueError, match="view must be"):
        zero_bubble.median_round(base, new, view="simulated")
