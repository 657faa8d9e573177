"""A straggler: one rank's compute stretched, simulated (Costs.slowdown) and live
(pl.with_slowdown, techniques/straggler.py)."""
from __future__ import annotations

import statistics

import pytest

import pipelab as pl
from pipelab.techniques.straggler import slowdown_of


def _step(name: str, p: int, m: int, **costs) -> float:
    return pl.simulate(pl.schedule(name, ranks=p, microbatches=m), pl.Costs(**costs)).makespan


def test_a_slow_last_rank_stretches_1f1b_by_hand():
    # 1F1B, p=4, m=8, F=1, B=2 (I=W=1). The last rank has no warm-up: microbatch 0 reaches it
    # after (p-1)F, from then on it is the bottleneck and busy m·s(F+B), and the last backward
    # drains through the p-1 ranks before it in (p-1)B. Step = (p-1)(F+B) + m·s(F+B).
    p, m, F, B, s = 4, 8, 1.0, 2.0, 1.1
    assert _step("1f1b", p, m, F=F, I=1, W=1) == (m + p - 1) * (F + B) == 33
    slow = _step("1f1b", p, m, F=F, I=1, W=1, slowdown={p - 1: s})
    assert slow == pytest.approx((p - 1) * (F + B) + m * s * (F + B))      # 35.4: +7.3%
    # An earlier rank r hides its (p-1-r) warm-up forwards' stretch in the wait for its first
    # backward: the step grows by (s-1)(F+B)(m - (p-1-r)).
    for r in range(p):
        got = _step("1f1b", p, m, F=F, I=1, W=1, slowdown={r: s})
        assert got == pytest.approx(33 + (s - 1) * (F + B) * (m - (p - 1 - r))), r


def test_slowdown_stretches_compute_not_messages_and_divides_over_chunks():
    # every stage of the slow rank, and only compute: comm is paid as before
    sched = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    table = pl.Costs(F=2.0, I=1.0, W=1.0, comm=0.5, slowdown={1: 1.5}).for_schedule(sched)
    for s in range(sched.stages):
        factor = 1.5 if sched.rank_of(s) == 1 else 1.0
        assert table.of("F", s) == pytest.approx(1.0 * factor)       # a chunk is half a rank
        assert table.of("W", s) == pytest.approx(0.5 * factor)
    assert table.comm == 0.5 and not table.slowdown


def test_factor_one_changes_nothing():
    base = _step("zb-h1", 4, 8)
    assert _step("zb-h1", 4, 8, slowdown={2: 1.0}) == base
    assert _step("zb-h1", 4, 8, slowdown={2: 1.2}) > base


@pytest.mark.parametrize("bad, words", [
    ({1: 0.9}, ">= 1"), ({1: float("nan")}, ">= 1"), ({1: True}, ">= 1"), ({-1: 1.1}, "rank"),
    ({"1": 1.1}, "rank"), ([1.1, 1.0], "dict"), (1.1, "dict"), ({1: "fast"}, ">= 1"),
])
def test_bad_slowdowns_are_refused(bad, words):
    with pytest.raises(ValueError, match="slowdown") as err:
        pl.Costs(slowdown=bad)
    assert words in str(err.value)
    with pytest.raises(ValueError, match="slowdown"):
        pl.with_slowdown(pl.schedule("1f1b", ranks=2, microbatches=2), bad)


def test_a_rank_the_schedule_lacks_is_refused():
    sched = pl.schedule("1f1b", ranks=2, microbatches=2)
    with pytest.raises(ValueError, match="rank 2"):
        pl.simulate(sched, pl.Costs(slowdown={2: 1.1}))
    with pytest.raises(ValueError, match="rank 2"):
        pl.with_slowdown(sched, {2: 1.1})


def test_slowdown_with_measured_times_is_refused():
    from pipelab.schedules import Action
    with pytest.raises(ValueError, match="per_action"):
        pl.Costs(per_action={Action(0, "F", 0): 1.0}, slowdown={0: 1.1})


def test_with_slowdown_leaves_the_schedule_alone():
    sched = pl.schedule("1f1b", ranks=2, microbatches=2)
    slow = pl.with_slowdown(sched, {1: 2})
    assert slowdown_of(slow) == {1: 2.0} and slowdown_of(sched) == {}
    assert slow.actions == sched.actions


def _cpu(res, rank: int) -> float:
    """Median CPU time of the rank's forwards and backwards."""
    return statistics.median(e.cpu for e in res.timeline.events
                             if e.rank == rank and e.action.kind in "FB")


def test_live_slowdown_stretches_one_rank_and_stays_exact():
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    with pl.LocalCluster(ranks=2) as cluster:
        cluster.run(sched)                                     # warm
        plain = cluster.run(sched)
        slow = cluster.run(pl.with_slowdown(sched, {1: 3.0}))
    assert slow.max_grad_error <= 1e-5 and slow.losses == plain.losses      # exact, unchanged
    assert slow.slowdown == {1: 3.0} and not hasattr(plain, "slowdown")
    assert ("step", "straggler") in slow.walk[1]
    # CPU time, not wall clock: rank 1's actions took about 3× as long, rank 0's did not
    # (a loose band: CPU times move with a busy machine's caches, not by 2×)
    stretched = _cpu(slow, 1) / _cpu(plain, 1)
    same = _cpu(slow, 0) / _cpu(plain, 0)
    assert 2.0 < stretched < 4.5 and stretched > 1.6 * same, (stretched, same)
