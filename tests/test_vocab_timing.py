"""The vocabulary generators' fast paths against the straightforward definitions: the base timed
in one walk over rows (vocab_timing.py) against `timed_run` along the dataflow graph, 1F1B's
rows against its order written out, the placement's one search and gather against the
rank-by-rank loop, and whole schedules against digests of the generators before they were
made fast (f9a7206)."""
from __future__ import annotations

import hashlib
from itertools import chain

import numpy as np
import pytest

from pipelab.schedules import registry, vocab, vocab_timing, vocab_vhalf
from pipelab.schedules.actions import B, F, I, W
from pipelab.schedules.base import Schedule
from pipelab.schedules.errors import ScheduleError
from pipelab.schedules.placement import v_placement
from pipelab.schedules.v_shape import block_actions


def _v_half(p: int, m: int, widen: int) -> Schedule:
    return Schedule(block_actions(p, m, lambda q: vocab_vhalf.widened_v_half_block(q, widen),
                                  squeezed=False), v_placement(p), m)


# Every shape of base the generators time, and schedules they do not (split backwards with W
# late, a squeezed V, GPipe), on costs that are not whole numbers: the same floats or a bug.
BASES = [(f"1f1b+{e} {p}x{m}", lambda p=p, m=m, e=e: vocab.one_f_one_b_rows(p, m, e)[0])
         for p, m, e in [(1, 3, 2), (2, 1, 1), (3, 7, 2), (4, 9, 1), (5, 3, 0)]] + \
    [(f"v-half+{w} {p}x{m}", lambda p=p, m=m, w=w: _v_half(p, m, w))
     for p, m, w in [(2, 4, 1), (3, 7, 2), (4, 9, 0), (5, 2, 1)]] + \
    [(f"{name} {p}x{m}", lambda name=name, p=p, m=m: registry.build(name, ranks=p, microbatches=m))
     for name, p, m in [("zb-h1", 4, 8), ("zb-h2", 3, 7), ("v-half", 4, 9), ("gpipe", 3, 5)]]
COSTS = {"F": 1.25, "B": 2.5, "I": 1.5, "W": 0.75}


@pytest.mark.parametrize("costs", [vocab.UNIT, COSTS], ids=["unit", "fractional"])
def test_the_walk_times_every_base_as_the_dataflow_graph_does(costs):
    for label, make in BASES:
        base = make()
        last = base.stages - 1
        fast = vocab_timing.walked(base, costs, (0, last))
        assert fast is not None, label                      # the fast way took it
        when = vocab_timing.unit_times(base, costs)          # the general way
        flat = list(chain.from_iterable(base.actions))
        assert fast.start.tolist() == [when[a][0] for a in flat], label
        assert fast.end.tolist() == [when[a][1] for a in flat], label
        assert fast.bounds == np.cumsum([0] + [len(a) for a in base.actions]).tolist()
        for s in (0, last):
            assert [flat[k] for k in fast.forward[s]] == [F(s, i) for i in range(base.microbatches)]
            assert [flat[k] for k in fast.grad[s]] == \
                [base.input_grad_action(s, i) for i in range(base.microbatches)], label


def test_what_the_walk_refuses_goes_the_general_way():
    """Whole and split backwards in one schedule are timed by the graph; a backward before its
    own forward deadlocks there too, and says so; a W without its I is refused."""
    mixed = Schedule([[F(0, 0), F(0, 1), B(0, 0), I(0, 1), W(0, 1)],
                      [F(1, 0), B(1, 0), F(1, 1), I(1, 1), W(1, 1)]], (0, 1), 2)
    assert vocab_timing.walked(mixed, vocab.UNIT, (0, 1)) is None
    when = vocab_timing.unit_times(mixed, vocab.UNIT)
    got = vocab_timing.timeline(mixed, vocab.UNIT, (0, 1))
    assert got.start.tolist() == [when[a][0] for a in chain.from_iterable(mixed.actions)]
    assert got.start.tolist() == [0, 1, 4, 6, 7, 1, 2, 4, 5, 6]        # by hand
    stuck = Schedule([[F(0, 0), B(0, 0)], [B(1, 0), F(1, 0)]], (0, 1), 1)
    assert vocab_timing.walked(stuck, vocab.UNIT, (0, 1)) is None
    with pytest.raises(ScheduleError, match="deadlock"):
        vocab_timing.timeline(stuck, vocab.UNIT, (0, 1))
    w_without_i = Schedule([[F(0, 0), B(0, 0), W(0, 0)], [F(1, 0), B(1, 0)]], (0, 1), 1)
    assert vocab_timing.walked(w_without_i, vocab.UNIT, (0, 1)) is None


def _one_f_one_b_written_out(rank: int, ranks: int, m: int, extra: int) -> list:
    warmup = min(ranks - rank - 1 + extra, m)
    acts = [F(rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        acts += [F(rank, warmup + i), B(rank, i)]
    return acts + [B(rank, i) for i in range(m - warmup, m)]


def test_one_f_one_b_rows_are_its_order():
    for p, m, extra in [(1, 1, 2), (2, 5, 1), (4, 3, 2), (5, 12, 0), (6, 7, 2)]:
        base, rows = vocab.one_f_one_b_rows(p, m, extra)
        assert base.actions == [_one_f_one_b_written_out(r, p, m, extra) for r in range(p)]
        again = vocab_timing.rows_of(base)
        assert all((a == b).all() for a, b in zip(rows, again)), (p, m, extra)


def test_the_placement_is_the_rank_by_rank_loop():
    """Groups due at, between and past the actions' starts, several at one time, empty ones."""
    base = _v_half(3, 5, 1)
    when = vocab_timing.timeline(base, vocab.UNIT, (0, base.stages - 1))
    ends = when.end.tolist()
    times = sorted([0.0, ends[3], ends[3], ends[7] - 0.5, ends[20], ends[20], max(ends) + 1,
                    float("inf")])
    groups = [(at, [("S", g % 5), ("C", g % 5)] if g % 3 else [("Vf", g % 5)] if g % 2 else [])
              for g, at in enumerate(times)]
    got = vocab._place(base, when, groups)
    last = base.stages - 1
    for r, own in enumerate(base.actions):
        starts = when.start[when.bounds[r]:when.bounds[r + 1]].tolist()
        want, k = [], 0
        for at, items in groups:
            while k < len(own) and starts[k] < at:
                want.append(own[k])
                k += 1
            want += [(base.stages_of(r)[0] if kind == "S" else 0 if kind == "Vf" else last,
                      kind, i) for kind, i in items]
        assert got[r] == want + own[k:], r


def test_action_rows_are_shared_and_start_again_past_their_limit():
    rows = vocab.ActionRows(limit=10)
    first = rows.get(2, "S", 4)
    assert first[:4] == [(2, "S", i) for i in range(4)]
    assert rows.get(2, "S", 6) is first and first[:6] == [(2, "S", i) for i in range(6)]
    assert rows.get(2, "S", 3) is first                      # shorter: the same row
    again = rows.get(2, "T", 5)                              # 11 > 10: emptied first
    assert again == [(2, "T", i) for i in range(5)] and rows.held == 5
    assert rows.get(2, "S", 2) is not first


# Digests (sha256 of the actions, placement and microbatches) of the generators at f9a7206,
# before the weave was made fast: 2,099 more were compared when it was.
BEFORE = {("vocab-1", 2, 1): "c79be5d7d7b47d17cda2", ("vocab-1", 3, 7): "9f24d5f300ed11a6e952",
          ("vocab-1", 8, 17): "5efbaba6ba43c42381f5", ("vocab-2", 4, 9): "1ce5ebe17f05fca89c12",
          ("vocab-2", 7, 2): "84b71f387571d010dff6", ("v-half-vocab", 2, 4): "c23e0a16da32b51b3b32",
          ("v-half-vocab", 5, 11): "8874ff0f2dd55df959c8",
          ("v-half-vocab", 6, 13): "4285bdb0fdb55a9c94fd"}


def test_schedules_are_the_ones_before():
    for (name, p, m), want in BEFORE.items():
        s = registry.build(name, ranks=p, microbatches=m)
        text = repr((s.actions, tuple(s.placement), s.microbatches))
        assert hashlib.sha256(text.encode()).hexdigest()[:20] == want, (name, p, m)
