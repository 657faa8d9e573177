"""Consecutive training steps (pipelab.schedules.steps): with post-validation the steps tile, and each step
after the first costs the zero-bubble paper's per-rank span, not the wall-clock of one step."""
from __future__ import annotations

import pytest

import pipelab as pl
from pipelab.views import compare
from pipelab.schedules.steps import consecutive


@pytest.mark.parametrize("F,I,W", [(1, 1, 1), (1, 1.5, 0.5), (2, 1, 1)])
def test_each_further_zb_h2_step_costs_the_closed_form_span(F, I, W):  # noqa: E741
    p, m = 4, 8
    costs = pl.Costs(F=F, I=I, W=W)
    one = compare.simulate_named("zb-h2", p, m, costs)
    two = pl.simulate(consecutive(one.schedule, 2), costs)
    three = pl.simulate(consecutive(one.schedule, 3), costs)
    # ZB-H2's per-rank span (Qi et al., Table 2), written out: m(F+I+W) + (p-1)·max(0, F+I-2W)
    # (the paper's bubble; a cheap W leaves part of it: 24 + 3·1.5 at 1 : 1.5 : 0.5).
    span = m * (F + I + W) + (p - 1) * max(0.0, F + I - 2 * W)
    if F == I == W:
        assert one.makespan == span + (p - 1) * F      # one isolated step: the late start shows
    assert two.makespan - one.makespan == pytest.approx(span)
    assert three.makespan - two.makespan == pytest.approx(span)


def test_zb_h1_and_1f1b_steps_cost_their_whole_makespan():
    for name, per_step in (("zb-h1", 27.0), ("1f1b", 33.0)):  # docs/formulas.md's values
        one = compare.simulate_named(name, 4, 8, pl.Costs())
        two = pl.simulate(consecutive(one.schedule, 2), pl.Costs())
        assert two.makespan == 2 * per_step


def test_consecutive_numbers_the_second_step_after_the_first_and_validates():
    s = pl.schedule("1f1b", ranks=2, microbatches=2)
    two = consecutive(s, 2)
    two.validate()
    assert two.microbatches == 4
    assert [str(a) for a in two.actions[0]] == ["0F0", "0F1", "0B0", "0B1",
                                                "0F2", "0F3", "0B2", "0B3"]


def test_consecutive_shifts_both_parts_of_a_pair():
    s = pl.schedule("dualpipe-v", ranks=2, microbatches=4)
    two = consecutive(s, 2)
    two.validate()
    pairs = [a for a in two.actions[0][len(s.actions[0]):] if len(a.parts) > 1]
    assert pairs and all(part.microbatch >= 4 for pair in pairs for part in pair.parts)


def test_consecutive_refuses_what_it_cannot_renumber():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        consecutive(pl.schedule("1f1b", ranks=2, microbatches=2), 0)
    with pytest.raises(ValueError, match="routes"):
        consecutive(pl.schedule("chimera", ranks=4, microbatches=4), 2)
