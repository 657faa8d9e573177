"""pl.plan for a model shape: a 7B-like GPT on 16 A100s of 80 GB, costed by closed forms.

Memory is checked against Korthikanti et al.'s byte model and the parameter count written out
here by hand (not through sim/flops.py), on the schedules whose in-flight counts are known.
"""
import math

import pytest

import pipelab as pl

# Llama-2-7B's size with a GPT's 4h MLP: 6.7e9 parameters.
H, L, A, S, V = 4096, 32, 32, 4096, 32_000
SHAPE = pl.ModelShape(hidden=H, layers=L, heads=A, seq_len=S, vocab=V)
A100 = pl.Device.named("A100-80GB")
GB = 1e9
SMALL = dict(batch_size=32, microbatches=(8, 16, 32))     # a few candidates per mesh


@pytest.fixture(scope="module")
def at_80gb():
    return pl.plan(SHAPE, 16, 80 * GB, device=A100,
                   schedules=("1f1b", "zb-v", "v-half", "v-half-vocab"), **SMALL)


def blocks(bounds):
    """Blocks in each stage of a flat (embedding, blocks…, output layer) split."""
    return [min(b, L + 1) - max(a, 1) for a, b in bounds]


def static_by_hand(c, stages_of):
    """18 bytes a parameter (bf16 weights, fp32 gradients, fp32 master and two moments)."""
    t = c.tensor
    # a block: QKV 3h² + 3h and projection h² (+ h, replicated), MLP h·4h + 4h and 4h·h
    # (+ h, replicated), two LayerNorms 4h; the matrices and column biases split over t
    block = (12 * H * H + 7 * H) / t + 6 * H
    n = blocks(c.bounds)
    out = []
    for rank in range(c.pipeline):
        mine = stages_of(rank)
        params = sum(n[s] * block for s in mine)
        if c.vocab:
            params += 2 * V * H / t / c.pipeline + (S * H if 0 in mine else 0)
        else:
            params += (V * H / t + S * H if 0 in mine else 0)
            params += (V * H / t + 2 * H if len(c.bounds) - 1 in mine else 0)
        out.append(18 * params)
    return out


def block_activations(c):
    """Bytes a block keeps for one microbatch (sequence parallel with tp)."""
    sbh = S * c.rows * H / c.tensor
    return {"none": sbh * (34 + 5 * A * S / H), "selective": 34 * sbh, "full": 2 * sbh}[c.recompute]


def test_a_7b_shape_on_16_gpus_is_ranked_by_time_and_its_best_fits(at_80gb):
    p = at_80gb
    assert [c.step_time for c in p] == sorted(c.step_time for c in p)
    best = p.best
    assert best.fits and best.peak_memory <= 80 * GB and best is p.fitting[0]
    assert best.devices == 16
    assert any(not c.fits for c in p[:p.index(best)]) or p[0] is best
    # every mesh of 16 with tp inside an 8-GPU node was tried
    meshes = {(c.pipeline, c.data_parallel, c.tensor) for c in p}
    assert {tp for _, _, tp in meshes} == {1, 2, 4, 8}
    assert all(pp * dp * tp == 16 for pp, dp, tp in meshes)
    assert {"v-half", "v-half-vocab"} <= {c.schedule for c in p}
    assert "GB" in p.explain() and "GB" in p.table(3)


def test_memory_per_rank_is_the_byte_model_by_hand_on_1f1b(at_80gb):
    """1F1B's rank r holds min(p − r, m) microbatches of its stage's blocks; the last stage
    also keeps the output layer's input (bf16) and its fp32 logits."""
    checked = 0
    for c in at_80gb:
        if c.schedule != "1f1b" or c.pipeline == 1:
            continue
        static = static_by_hand(c, lambda r: [r])
        n = blocks(c.bounds)
        for r in range(c.pipeline):
            acts = n[r] * block_activations(c)
            if r == c.pipeline - 1:
                acts += S * c.rows * H * 2 + S * c.rows * V * 4 / c.tensor
            held = min(c.pipeline - r, c.microbatches)
            assert math.isclose(c.memory_by_rank[r], static[r] + held * acts, rel_tol=1e-6), \
                (c.label(), r)
        checked += 1
    assert checked >= 20


def test_v_half_vocab_shards_the_tables_once_per_rank(at_80gb):
    """V placement: rank r holds stages r and 2p − 1 − r, and one shard of each table."""
    c = next(c for c in at_80gb if c.schedule == "v-half-vocab" and c.pipeline == 4)
    p = c.pipeline
    assert math.isclose(sum(c.static), sum(static_by_hand(c, lambda r: [r, 2 * p - 1 - r])),
                        rel_tol=1e-9)
    assert all(math.isclose(a, b, rel_tol=1e-9)
               for a, b in zip(c.static, static_by_hand(c, lambda r: [r, 2 * p - 1 - r])))


def test_memory_that_fits_nothing_is_refused_with_the_smallest_need():
    p = pl.plan(SHAPE, 16, 2 * GB, device=A100, schedules=("1f1b", "v-min"), **SMALL)
    assert not p.fitting
    smallest = min(c.peak_memory for c in p)
    with pytest.raises(ValueError, match=rf"nothing fits in memory_per_device=2\.0 GB on 16 "
                                         rf"device\(s\): the smallest predicted peak is "
                                         rf"{smallest / GB:.1f} GB"):
        p.best


def test_more_memory_never_makes_the_best_slower_and_recomputation_only_when_forced():
    budgets = (20 * GB, 30 * GB, 45 * GB, 80 * GB, 200 * GB)
    bests, forced = [], 0
    for budget in budgets:
        p = pl.plan(SHAPE, 8, budget, device=A100, schedules=("1f1b", "zb-v"), batch_size=16,
                    microbatches=(8, 16))
        best = p.best
        # the fastest of those whose fullest rank fits, read off the ranks here
        assert best.step_time == min(c.step_time for c in p if max(c.memory_by_rank) <= budget)
        bests.append(best.step_time)
        if best.recompute != "none":
            forced += 1
            twin = next(c for c in p if c.recompute == "none" and c.label() ==
                        best.label().replace(f"recompute {best.recompute}", "recompute none"))
            assert not twin.fits and twin.step_time < best.step_time
    assert bests == sorted(bests, reverse=True)
    assert forced and best.recompute == "none"      # forced at a small budget, not at 200 GB


@pytest.mark.parametrize("kwargs, match", [
    (dict(devices=37), "cannot be factored"),             # prime, more than layers + 2
    (dict(calibration=object()), "calibration is for a pl.ModelConfig"),
    (dict(device="A100"), "device must be a pl.Device"),
    (dict(gpus_per_node=0), "gpus_per_node"),
    (dict(optimizer="sgd"), "optimizer"),
    (dict(recompute=("every-k",)), "recompute"),
])
def test_bad_shape_plans_are_refused_by_name(kwargs, match):
    args = dict(devices=16, memory_per_device=80 * GB, batch_size=32)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pl.plan(SHAPE, **args)


def test_a_config_plan_refuses_v_half_vocab_and_a_device():
    cfg = pl.ModelConfig()
    with pytest.raises(ValueError, match="v-half-vocab cannot be planned for a pl.ModelConfig"):
        pl.plan(cfg, 2, 1e9, schedules=["v-half-vocab"], calibration=object())
    with pytest.raises(ValueError, match="device is for a pl.ModelShape"):
        pl.plan(cfg, 2, 1e9, device=A100)
    with pytest.raises(ValueError, match="model must be a pl.ModelConfig or a pl.ModelShape"):
        pl.plan("7B", 2, 1e9)
