"""Chapter 12's 'what a plan must leave room for': the microbatch-size trade-off's closed form
against the planner's simulated steps, on a calibration written by hand."""
from __future__ import annotations

import math

import pytest

import pipelab as pl
from pipelab.chapters import planner_room as room
from pipelab.planner.calibrate import Calibration, flop_shares

CFG = pl.ModelConfig(n_layers=4, d_model=64)


def _calibration(fixed: float, per_row: float) -> Calibration:
    """Every layer: forward fixed + per_row·rows, backward twice that; no latency costs."""
    n = CFG.total_layers
    w, core = flop_shares(CFG)
    return Calibration(CFG, ((fixed, per_row),) * n, ((2 * fixed, 2 * per_row),) * n, w, core,
                       latency=0.0, bandwidth=math.inf)


def test_stage_lines_are_the_sum_of_the_layers_lines():
    cal = _calibration(1e-3, 1e-4)
    # two layers a stage: F + I + W = 3 × (fixed + per row) per layer
    flat = [x for line in room.stage_lines(cal, [(0, 2), (2, 4), (4, 6)]) for x in line]
    assert flat == pytest.approx([6e-3, 6e-4] * 3)


def test_the_closed_form_finds_the_planners_best_m():
    for fixed, per_row in ((1e-3, 1e-4), (1e-4, 1e-4), (1e-3, 1e-5)):
        cal = _calibration(fixed, per_row)
        steps = room.microbatch_steps(CFG, cal, pipeline=3, batch_size=32)
        assert sorted(steps) == [1, 2, 4, 8, 16, 32]
        lines = room.stage_lines(cal, steps[1].bounds)
        by_formula, m_star = room.closed_form_best(lines, list(steps), 32)
        brute = min(steps, key=lambda m: steps[m].step_time)
        assert by_formula == brute, (fixed, per_row)
        a, c = lines[0]
        assert m_star == pytest.approx(math.sqrt(2 * c * 32 / a))
        # equal stages, no messages: the closed form is the simulated 1F1B step itself
        for m, cand in steps.items():
            assert cand.step_time == pytest.approx(room.closed_form_step(lines, m, 32))


def test_the_explorer_draws_and_says_the_best_m():
    box = room.microbatch_explorer(CFG, _calibration(1e-3, 1e-4), pipeline=2, batch_size=16)
    box.controls["m"].value = 3
    text = "".join(o.get("text", "") for o in box.out.outputs)
    assert "m = 8:" in text and "best m =" in text
