"""A custom model partitioned, calibrated, planned and recomputed (tests/pipelab_test_custom.py).

Partitions and plans are checked on given or measured per-layer figures; the measured bytes
against what the test stack's layers hold by construction; one live pair of runs shows
recomputation exact on a custom model and dropping what its layers save.
"""
from __future__ import annotations

import pytest
import torch

import pipelab as pl
from pipelab.model.custom_profile import profile_layers
from pipelab.techniques.recompute import Policy, Recomputer, any_layer

MOD = "pipelab_test_custom"
MODEL = pl.CustomModel(layers=f"{MOD}:layers", loss=f"{MOD}:loss", batch=f"{MOD}:batch")
SEQ = 4                                      # pipelab_test_custom.SEQ: tokens a row
LINEARS = {1, 3, 6, 7}                       # the layers holding an nn.Linear (W work)


@pytest.fixture(scope="module")
def cal():
    return pl.calibrate(MODEL, repeats=1, warmup=1)


def test_heavy_first_layer_moves_the_cost_cut():
    """Layer 0 ten times the others: 'cost' gives it a stage alone, 'uniform' does not, and
    the heaviest stage gets lighter; 'params' balances the parameters the layers hold."""
    times = [10.0] + [1.0] * 7
    uniform = pl.partition(MODEL, 2, "uniform", layer_times=times)
    cost = pl.partition(MODEL, 2, "cost", layer_times=times)
    assert uniform.bounds == [(0, 4), (4, 8)] and cost.bounds == [(0, 1), (1, 8)]
    assert cost.layout == "0|1-7" and cost.max_load() == 10.0 < uniform.max_load() == 13.0
    params = pl.partition(MODEL, 3, "params")
    counts = [sum(p.numel() for p in layer.parameters()) for layer in MODEL.layers()]
    assert params.params == [sum(counts[a:b]) for a, b in params.bounds]
    assert params.imbalance("params") < pl.partition(MODEL, 3).imbalance("params")
    assert "time ms" in str(cost) and "-" in str(cost).splitlines()[2]     # no FLOP model


def test_measured_cost_partition_covers_the_layers():
    """Without layer_times, 'cost' measures each layer (one number a layer, all positive)."""
    part = pl.partition(MODEL, 3, "cost")
    assert len(part.layer_times) == MODEL.total_layers and min(part.layer_times) > 0
    assert part.bounds[0][0] == 0 and part.bounds[-1][1] == MODEL.total_layers


def test_calibrate_one_row_per_layer(cal):
    """Times for every layer; W only where an nn.Linear defers its GEMMs; the bytes each layer
    receives are what the stack passes by construction (ids: 8 bytes a token)."""
    assert len(cal.forward) == len(cal.input_grad) == len(cal.weight_grad) == MODEL.total_layers
    assert all(cal.forward_time(i, i + 1, 4) > 0 for i in range(MODEL.total_layers))
    stashed = {i for i in range(MODEL.total_layers) if cal.bytes("stash", i, i + 1, 4) > 0}
    assert stashed == LINEARS
    assert cal.inputs[0] == (0.0, 8.0 * SEQ)                 # int64 token ids
    assert cal.inputs[1] == (0.0, (4 * 8 + 8) * SEQ)         # (hidden of width 8, ids)
    assert cal.bytes("saved", 5, 6, 4) == 0                  # Drop saves nothing


def test_profile_w_is_the_deferred_gemms():
    """A layer without Linear has no W pass: its parameters' gradients come with I."""
    prof = profile_layers(MODEL, 2, repeats=1, warmup=0)
    assert all(p.stash_bytes == 0 for i, p in enumerate(prof) if i not in LINEARS)
    assert prof[5].saved_bytes == 0 and prof[0].input_bytes == 2 * SEQ * 8


def test_plan_ranks_and_its_best_fits(cal):
    plan = pl.plan(MODEL, 2, 2**20, calibration=cal, batch_size=8)
    times = [c.step_time for c in plan]
    assert times == sorted(times) and len({c.schedule for c in plan}) > 2
    assert plan.best.fits and plan.best.peak_memory <= 2**20
    assert {c.pipeline for c in plan} == {1, 2} and {c.tensor for c in plan} == {1}
    whole = next(c for c in plan if c.pipeline == 1 and c.recompute == "none")
    # AdamW: the parameters, their gradients and two moments, 4 bytes each
    assert whole.static == [4 * sum(MODEL.layer_parameter_bytes())]
    tight = pl.plan(MODEL, 2, plan.best.peak_memory - 1, calibration=cal, batch_size=8)
    assert not next(c for c in tight if c.label() == plan.best.label()).fits


def test_what_cannot_apply_is_refused(cal):
    with pytest.raises(ValueError, match="custom model is split by 'uniform', 'params' or 'cost'"):
        pl.partition(MODEL, 2, "E|t*3|L")
    with pytest.raises(ValueError, match="stages=9 but the model has only 8 layers"):
        pl.partition(MODEL, 9, "params")
    with pytest.raises(ValueError, match="a custom model has no FLOP model"):
        pl.partition(MODEL, 2).loads("flops")
    with pytest.raises(ValueError, match="vocab-1 cannot be planned for a pl.CustomModel"):
        pl.plan(MODEL, 2, 2**20, calibration=cal, schedules=["vocab-1"])
    with pytest.raises(ValueError, match="'selective' drops the GPT's attention core"):
        pl.plan(MODEL, 2, 2**20, calibration=cal, recompute=["selective"])
    with pytest.raises(ValueError, match="calibrate\\(cluster=...\\) measures the runtime"):
        pl.calibrate(MODEL, cluster=object())
    other = pl.CustomModel(layers=f"{MOD}:layers", loss=f"{MOD}:loss", batch=f"{MOD}:batch",
                           seed=1)
    with pytest.raises(ValueError, match="calibration was measured for another model"):
        pl.plan(other, 2, 2**20, calibration=cal)


def test_full_recompute_drops_each_layer():
    """Each layer of a custom stage is one region, its saved tensors held back until R."""
    stage = MODEL.build(0, 4)
    rec = Recomputer({0: Policy("full")}, None, any_layer)
    x, y = MODEL.batch(2, 0)
    rec.forward(stage, x, 0, 0)
    regions = rec.pending[(0, 0)]
    assert len(regions) == 4
    assert all(ref().tensor is None for r in regions for ref in r.slots if ref() is not None)
    assert rec.recompute(0, 0) == 4


def test_recompute_live_exact_and_drops(clusters):
    """every-k (k=2) on 2 ranks with the I/W split: gradients exact, an R per backward, and
    rank 0 holds less at its peak than without recomputation (its Linears' saved inputs drop)."""
    sched = pl.schedule("zb-h1", ranks=2, microbatches=4)
    plain = clusters(2).run(sched, model=MODEL, progress=False)
    res = clusters(2).run(sched, model=MODEL, recompute={"policy": "every-k", "k": 2},
                          progress=False)
    assert res.max_grad_error < 1e-5
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    assert sum(e.action.kind == "R" for e in res.timeline.events) == 2 * 4
    assert res.peak_activations[0] < plain.peak_activations[0]


def test_llama_example_is_causal_and_rotary():
    """The shipped example (pipelab/chapters/your_own_model/llama_stack.py): RoPE keeps each
    head's norm (a rotation), a later token cannot change an earlier output (causal), and two
    builds with one seed are the same model."""
    from pipelab.chapters.your_own_model import llama_stack as ls

    q = torch.randn(2, ls.HEADS, ls.SEQ, ls.WIDTH // ls.HEADS)
    attn = ls.Attention()
    turned = ls.rotate(q, attn.cos, attn.sin)
    assert torch.allclose(turned.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(turned[:, :, 1:], q[:, :, 1:])      # positions > 0 do turn
    block = ls.heavy_layers(0)[1]
    x = torch.randn(1, ls.SEQ, ls.WIDTH)
    y = x.clone()
    y[:, -1] += 1.0
    with torch.no_grad():
        assert torch.equal(block(x)[:, :-1], block(y)[:, :-1])
    a, b = ls.layers(3), ls.layers(3)
    assert all(torch.equal(p, r) for la, lb in zip(a, b)
               for p, r in zip(la.parameters(), lb.parameters()))


def test_the_pruned_plan_is_the_exhaustive_one(cal):
    """pl.plan prunes by default (tests/test_plan_prune.py); on a custom model's source too."""
    from test_plan_prune import assert_same
    kw = dict(calibration=cal, batch_size=8)
    budget = sorted(c.peak_memory for c in pl.plan(MODEL, 2, 2**40, prune=False, **kw))[20]
    assert_same(pl.plan(MODEL, 2, budget, **kw), pl.plan(MODEL, 2, budget, prune=False, **kw))
