"""ZeRO-1 in the byte model and the planner, links by topology, device names, and the two bugs
of sim/scale.py the papers review found (two stages per rank; vocabulary passes uncosted)."""
import dataclasses
import math

import pytest

import pipelab as pl
from pipelab.planner.shaped import crossings
from pipelab.sim.scale import per_rank_bytes, simulate_shape
from pipelab.sim.shape import bytes_per_parameter

SHAPE = pl.ModelShape(hidden=4096, layers=32, heads=32, seq_len=4096, vocab=32_000)
A100 = pl.Device.named("A100-80GB")


def test_bytes_per_parameter_is_megatrons_distributed_optimizer_table_by_hand():
    # Megatron-LM's "Distributed Optimizer" table, bf16 parameters with fp32 gradients:
    #   not distributed: 2 (bf16 weight) + 4 (fp32 grad) + 4 (fp32 master) + 4 + 4 (Adam m, v) = 18
    #   distributed over d replicas: 6 + 12/d  ->  d=1: 18, d=2: 12, d=4: 9, d=8: 7.5
    assert bytes_per_parameter("adamw", 8) == 18
    for d, by_hand in ((1, 18.0), (2, 12.0), (4, 9.0), (8, 7.5), (64, 6.1875)):
        assert bytes_per_parameter("zero-1", d) == by_hand


def test_a_shapes_static_bytes_follow_the_optimizer():
    one = pl.shape_profile(SHAPE, 1, 4, A100)
    four = pl.shape_profile(SHAPE, 1, 4, A100, optimizer="zero-1", data_parallel=4)
    assert all(math.isclose(b, a * 9 / 18) for a, b in zip(one.static_bytes, four.static_bytes))
    # the collective: fp32 grads reduce-scattered (4) + bf16 weights all-gathered (2) = 6(n-1)/n,
    # an all-reduce's 2(n-1)/n of 3 bytes a parameter, against Adam's all-reduce of 4
    assert all(math.isclose(b, a * 3 / 4) for a, b in
               zip(one.table["parameter_bytes"], four.table["parameter_bytes"]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(optimizer="zero-3"), r"optimizer must be one of \('adamw', 'zero-1'\)"),
    (dict(optimizer="zero-1", data_parallel=0), "data_parallel"),
    (dict(pipeline_inter_node="yes"), "pipeline_inter_node must be True or False"),
])
def test_bad_profile_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pl.shape_profile(SHAPE, 1, 4, A100, **kwargs)


def test_plan_refuses_an_unknown_optimizer_and_a_bad_headroom():
    with pytest.raises(ValueError, match="'adamw' .* or 'zero-1'"):
        pl.plan(SHAPE, 16, 80e9, optimizer="zero-2")
    for bad in (-0.1, 1.0, "10%", True):
        with pytest.raises(ValueError, match="memory_headroom"):
            pl.plan(SHAPE, 16, 80e9, memory_headroom=bad)


QUESTION = dict(devices=16, memory_per_device=80e9, batch_size=32, microbatches=(8,),
                schedules=("1f1b", "zb-v"), recompute=("none",))


def test_zero1_shrinks_the_static_bytes_by_dp_and_the_plan_says_what_it_assumed():
    whole = pl.plan(SHAPE, device=A100, **QUESTION)
    sharded = pl.plan(SHAPE, device=A100, optimizer="zero-1", **QUESTION)
    pairs = {c.label(): c for c in whole}
    for c in sharded:
        twin = pairs[c.label()]
        per = 6 + 12 / c.data_parallel
        assert all(math.isclose(b, a * per / 18) for a, b in zip(twin.static, c.static))
        assert c.activation_peak == twin.activation_peak
    assert "ZeRO-1" in sharded.explain() and "6 + 12/dp" in sharded.explain()
    assert "no optimizer sharding: 18 bytes" in whole.explain()
    # the review's hand figure: zb-v p=2 dp=4 tp=2 m=8 fits with ZeRO-1 (about 68 GB), not without
    label = "zb-v p=2 dp=4 tp=2 m=8, v=2, recompute none"
    big = pl.plan(SHAPE, device=A100, **dict(QUESTION, schedules=("zb-v",)))
    small = pl.plan(SHAPE, device=A100, optimizer="zero-1", **dict(QUESTION, schedules=("zb-v",)))
    b = next(c for c in big if c.label() == label)
    s = next(c for c in small if c.label() == label)
    assert not b.fits and s.fits and 66e9 < s.peak_memory < 70e9


def test_headroom_lowers_the_budget_a_candidate_must_fit():
    plain = pl.plan(SHAPE, device=A100, optimizer="zero-1", **QUESTION)
    kept = pl.plan(SHAPE, device=A100, optimizer="zero-1", memory_headroom=0.2, **QUESTION)
    assert kept.budget == pytest.approx(64e9)
    for a, b in zip(sorted(plain, key=lambda c: c.label()), sorted(kept, key=lambda c: c.label())):
        assert b.fits == (b.peak_memory <= 64e9) and (a.fits or not b.fits)
    assert sum(c.fits for c in kept) < sum(c.fits for c in plain)
    assert "20% of each device kept free" in kept.explain()


def test_crossings_follow_megatrons_rank_order():
    assert crossings(2, 2, 2, 8) == (False, False)          # 8 GPUs: one node
    assert crossings(2, 4, 2, 8) == (True, False)           # tp x dp = 8 tiles a node
    assert crossings(2, 8, 1, 8) == (True, False)
    assert crossings(1, 16, 1, 8) == (False, True)          # a ring of 16 leaves the node
    assert crossings(4, 2, 4, 8) == (True, False)
    assert crossings(4, 3, 1, 8) == (True, True)            # 3 does not tile 8
    assert crossings(2, 3, 1, 8) == (False, False)          # 6 GPUs: one node


def test_traffic_that_leaves_a_node_pays_the_inter_node_link():
    nv = dataclasses.replace(A100, inter_node_bandwidth=None, inter_node_latency=None)
    inside = pl.shape_profile(SHAPE, 1, 2, nv, data_parallel=8,
                              pipeline_inter_node=True, data_inter_node=True).table
    crossed = pl.shape_profile(SHAPE, 1, 2, A100, pipeline_inter_node=True,
                               data_inter_node=True).table
    home = pl.shape_profile(SHAPE, 1, 2, A100).table
    message = 4096 * 4096 * 2
    assert crossed["comm"] == pytest.approx(2e-5 + message / 25e9)     # InfiniBand HDR
    assert home["comm"] == pytest.approx(1e-5 + message / 300e9) == inside["comm"]
    assert crossed["bandwidth"] == 25e9 and home["bandwidth"] == 300e9 == inside["bandwidth"]
    # a 16-GPU plan: p=2 dp=4 tp=2 crosses on its pipeline only; p=1 dp=4 tp=4 on its ring
    fast = pl.plan(SHAPE, device=nv, **QUESTION)
    slow = pl.plan(SHAPE, device=A100, **QUESTION)
    t = {(c.label()): c.step_time for c in fast}
    for c in slow:
        assert c.step_time >= t[c.label()] - 1e-12
        if c.pipeline == 1 and c.data_parallel * c.tensor <= 8:
            assert c.step_time == pytest.approx(t[c.label()])   # nothing leaves a node


@pytest.mark.parametrize("name, canonical", [
    ("H100", "H100"), ("H100-80GB", "H100"), ("H100-SXM", "H100"), ("nvidia h100 sxm5", "H100"),
    ("A100-SXM4-80GB", "A100-80GB"), ("a100_40gb", "A100-40GB"), ("A800-80GB", "A800")])
def test_usual_device_names_are_accepted(name, canonical):
    assert pl.Device.named(name) is pl.Device.named(canonical)


@pytest.mark.parametrize("name, match", [("A100", "40 or 80 GB"), ("H100-PCIe", "756 TFLOPS"),
                                         ("B200", "unknown device")])
def test_ambiguous_or_unknown_device_names_are_refused(name, match):
    with pytest.raises(ValueError, match=match):
        pl.Device.named(name)


@pytest.mark.parametrize("name", ["zb-v", "v-half", "interleaved-1f1b"])
def test_two_stages_per_rank_count_both_stages_activations(name):
    """Walk the timeline: F adds its stage's bytes, W (or B) frees them; the peak of that walk
    is what per_rank_bytes must report (it reported half for two stages a rank)."""
    tl, prof = simulate_shape(name, SHAPE, 4, 8, A100, chunks=2, recompute="selective",
                              layers_per_stage=[4.0] * 8)
    for rank, got in enumerate(per_rank_bytes(tl, prof)):
        live, peak = 0.0, 0.0
        for e in sorted((e for e in tl.events if e.rank == rank), key=lambda e: e.start):
            kind, stage = e.action.kind, e.action.stage
            if kind == "F":
                live += prof.activation_bytes[stage]
                peak = max(peak, live)
            elif kind in ("W", "B"):
                live -= prof.activation_bytes[stage]
        static = sum(prof.static_bytes[s] for s in tl.schedule.stages_of(rank))
        assert got == pytest.approx(static + peak, rel=1e-9), (name, rank)


def test_a_vocabulary_schedule_on_costs_without_vocabulary_passes_is_refused():
    costs = pl.Costs.from_shape(4096, 32, 32, 4096, 32_000, microbatch=1, stages=4)
    for name in ("vocab-1", "vocab-2"):
        with pytest.raises(ValueError, match="vocabulary passes S and T"):
            pl.simulate(pl.schedule(name, ranks=4, microbatches=8), costs)
    costed = pl.Costs.from_shape(4096, 32, 32, 4096, 32_000, microbatch=1, stages=4,
                                 vocab_schedule="vocab-1")
    assert pl.simulate(pl.schedule("vocab-1", ranks=4, microbatches=8), costed).makespan > 0
    # unit costs (chapter 08's) keep their free passes
    assert pl.simulate(pl.schedule("vocab-1", ranks=4, microbatches=8), pl.Costs()).makespan > 0
    # and v-half-vocab at scale runs Vocab-2's passes
    tl, prof = simulate_shape("v-half-vocab", SHAPE, 4, 8, A100)
    assert "S" in prof.table["kinds"] and tl.makespan > 0
