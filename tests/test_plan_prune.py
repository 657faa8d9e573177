"""The pruned search (`pl.plan(prune=True)`, the default) says what the exhaustive one says.

Each space is planned both ways: the pruned plan must pick the same best, print the same table
and explanation, have the same frontier and the same `nothing_fits`, and, read in full, list
every candidate in the same order with the same step time and the same peak memory per rank
(its memory read along program order, peaks.py; the exhaustive one's along the timeline). The
lower bound (bound.py) must never be above the simulated time, and pruning must have left
candidates unsimulated (else it proves nothing).
"""
import pytest

import pipelab as pl
from pipelab.planner.calibrate import Calibration, flop_shares
from pipelab.planner.plan import MiB

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16, vocab_size=64)
EVERY = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "vocab-1", "vocab-2",
         "looped-bfs")


def synthetic(cfg=CFG) -> Calibration:
    """Made-up costs with a fixed part and a per-row part, a runtime overhead and a link."""
    n = cfg.total_layers
    w, core = flop_shares(cfg)
    return Calibration(cfg, ((1e-3, 1e-4),) * n, ((2e-3, 2e-4),) * n, w, core, latency=1e-5,
                       bandwidth=1e8, overhead=2e-4)


def both(model, devices, budget, **kw):
    return (pl.plan(model, devices, budget, **kw),
            pl.plan(model, devices, budget, prune=False, **kw))


def assert_same(pruned, exhaustive):
    """Everything the plan says, then every candidate, equal; the bound below every time."""
    assert len(pruned) == len(exhaustive)
    assert pruned.simulated < len(pruned)              # it pruned something
    assert pruned.explain() == exhaustive.explain()
    assert pruned.table(8) == exhaustive.table(8)
    assert [c.label() for c in pruned.frontier()] == [c.label() for c in exhaustive.frontier()]
    assert pruned.nothing_fits() == exhaustive.nothing_fits()
    assert [(c.label(), c.step_time, c.memory_by_rank, c.fits) for c in pruned] == \
        [(c.label(), c.step_time, c.memory_by_rank, c.fits) for c in exhaustive]
    assert pruned.simulated == len(pruned)
    assert all(0 < c.bound <= c.step_time for c in pruned)


def test_a_calibrated_plan_pruned_is_the_exhaustive_one():
    kw = dict(calibration=synthetic(), batch_size=16, schedules=EVERY)
    wide = pl.plan(CFG, 4, 10**12, prune=False, **kw)
    budget = sorted(c.peak_memory for c in wide)[len(wide) // 3]     # memory binds
    pruned, exhaustive = both(CFG, 4, budget, **kw)
    assert exhaustive.best is not exhaustive[0]         # the fastest does not fit
    assert {c.schedule for c in exhaustive} == set(EVERY)
    assert len({c.recompute for c in exhaustive}) == 4
    assert_same(pruned, exhaustive)
    assert pruned.best.label() == exhaustive.best.label()
    assert pruned.best.step_time == exhaustive.best.step_time


def test_nothing_fits_pruned_names_the_same_smallest_candidate():
    kw = dict(calibration=synthetic(), batch_size=8, schedules=("1f1b", "zb-h1", "gpipe"))
    pruned, exhaustive = both(CFG, 2, 0.01 * MiB, **kw)
    assert pruned.simulated == 0                        # nothing fits: nothing to simulate yet
    with pytest.raises(ValueError, match="nothing fits") as info:
        pruned.best
    assert str(info.value) == exhaustive.nothing_fits()
    assert_same(pruned, exhaustive)


def test_a_shaped_plan_pruned_is_the_exhaustive_one():
    shape = pl.ModelShape(hidden=1024, layers=8, heads=16, seq_len=1024, vocab=32_000)
    kw = dict(batch_size=32, schedules=("1f1b", "zb-h1", "zb-v", "v-half", "vocab-2",
                                        "v-half-vocab"), microbatches=(4, 8, 16))
    wide = pl.plan(shape, 8, 1e15, prune=False, **kw)
    budget = sorted(c.peak_memory for c in wide)[len(wide) // 2]
    pruned, exhaustive = both(shape, 8, budget, **kw)
    assert {c.tensor for c in exhaustive} > {1}         # tensor parallelism's costs too
    assert_same(pruned, exhaustive)


def test_prune_must_be_a_bool():
    with pytest.raises(ValueError, match="prune must be True"):
        pl.plan(CFG, 2, 2**30, calibration=synthetic(), prune="yes")


def test_lone_step_times_are_step_time_stage_by_stage():
    """The bound's per-stage step times under tensor parallelism (numpy, all stages at once)
    are the simulator's `step_time` of each lone action, to the bit: with and without overlap,
    all-reduces longer and shorter than W, zero on some stages, B costed by its spec (I + W);
    and the gradient all-reduces' times are the simulator's."""
    import random

    from pipelab.schedules.actions import Action
    from pipelab.sim.tensor_overlap import lone_step_times, step_time
    from pipelab.techniques.data_parallel import REDUCE, reduction_of
    rng = random.Random(7)
    for trial in range(60):
        n = rng.randint(1, 9)
        draw = lambda: [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(n)]   # noqa: E731
        table = dict(F=[rng.uniform(0.1, 3) for _ in range(n)], I=draw(), W=draw(),
                     tp_allreduce=draw(), tp_overlap=trial % 2 == 0,
                     parameter_bytes=[rng.uniform(0, 1e9) for _ in range(n)],
                     replicas=rng.randint(1, 9), bandwidth=rng.uniform(1e9, 1e11),
                     latency=rng.uniform(0, 1e-4))
        if trial % 3 == 0:
            table["B"] = draw()
        costs = pl.Costs.per_stage(**table)
        for kind in ("F", "B", "I", "W", "R"):          # B by its spec (I + W), R (F)
            got = lone_step_times(costs, kind, n).tolist()
            want = [step_time(costs, Action(s, kind, 0))[0] for s in range(n)]
            assert got == want, (kind, table)
        # and each stage's gradient all-reduce over the replicas, by its kind's stage_costs
        assert costs.of_stages(REDUCE, n).tolist() == \
            [costs.duration(reduction_of(s)) for s in range(n)], table
