"""The toy GPT: shapes, deterministic initialisation, stage slices, config checks, cost table."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import pipelab as pl

SMALL = pl.ModelConfig(n_layers=3, d_model=32, n_heads=4, vocab_size=pl.VOCAB_SIZE, seq_len=16)


def batch(cfg: pl.ModelConfig, rows: int = 2, seed: int = 0):
    return pl.get_batch(rows, cfg.seq_len, seed=seed)


def test_shapes_layer_by_layer():
    cfg = SMALL
    model = pl.ToyGPT(cfg)
    assert len(model.layers) == cfg.total_layers == cfg.n_layers + 2
    x, _ = batch(cfg, rows=3)
    h = model.layers[0](x)
    assert h.shape == (3, cfg.seq_len, cfg.d_model)
    for block in model.layers[1:-1]:
        h = block(h)
        assert h.shape == (3, cfg.seq_len, cfg.d_model)
    logits = model.layers[-1](h)
    assert logits.shape == (3, cfg.seq_len, cfg.vocab_size)
    assert torch.equal(logits, model(x))
    assert model(x[:, :5]).shape == (3, 5, cfg.vocab_size)   # shorter than seq_len is fine


def test_untrained_loss_is_uniform_guess():
    model = pl.ToyGPT(pl.ModelConfig())
    loss = model.loss(*pl.get_batch(8, 32, seed=0)).item()
    assert abs(loss - math.log(64)) < 0.1


def test_same_seed_same_weights_and_loss():
    a, b = pl.ToyGPT(SMALL), pl.ToyGPT(SMALL)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    x, y = batch(SMALL)
    assert a.loss(x, y).item() == b.loss(x, y).item()


def test_different_seed_different_weights_and_loss():
    a = pl.ToyGPT(SMALL)
    b = pl.ToyGPT(pl.ModelConfig(**{**SMALL.as_dict(), "seed": 1}))
    assert not torch.equal(a.layers[1].qkv.weight, b.layers[1].qkv.weight)
    assert not torch.equal(a.layers[0].tok.weight, b.layers[0].tok.weight)
    x, y = batch(SMALL)
    assert a.loss(x, y).item() != b.loss(x, y).item()


def test_init_does_not_depend_on_global_rng():
    torch.manual_seed(123)
    a = pl.ToyGPT(SMALL)
    torch.manual_seed(456)
    b = pl.ToyGPT(SMALL)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("start,stop", [(0, 1), (1, 3), (2, 5), (4, 5), (0, 5)])
def test_stage_built_alone_equals_slice_of_full_model(start, stop):
    cfg = SMALL
    model = pl.ToyGPT(cfg)
    stage = pl.build_layers(cfg, start, stop)
    full = list(model.layers[start:stop].named_parameters())
    alone = list(stage.named_parameters())
    assert [n for n, _ in full] == [n for n, _ in alone]
    for (name, p), (_, q) in zip(full, alone):
        assert torch.equal(p, q), name
    # and it computes the same thing on the activations that reach it
    x, _ = batch(cfg)
    h = x
    for layer in model.layers[:start]:
        h = layer(h)
    expected = h
    for layer in model.layers[start:stop]:
        expected = layer(expected)
    assert torch.equal(stage(h), expected)


def test_stage_built_in_another_process_has_the_same_weights(tmp_path):
    out = tmp_path / "stage.pt"
    code = ("import torch, pipelab as pl; "
            f"cfg = pl.ModelConfig(**{SMALL.as_dict()!r}); "
            f"torch.save(pl.build_layers(cfg, 2, 4).state_dict(), {str(out)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    theirs = torch.load(out)
    ours = pl.ToyGPT(SMALL).layers[2:4].state_dict()
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_tied_embeddings_share_one_tensor():
    cfg = pl.ModelConfig(**{**SMALL.as_dict(), "tie_embeddings": True})
    model = pl.ToyGPT(cfg)
    assert model.layers[-1].out.weight is model.layers[0].tok.weight


@pytest.mark.parametrize("fields,name", [
    (dict(n_layers=0), "n_layers"),
    (dict(n_layers=-2), "n_layers"),
    (dict(d_model=0), "d_model"),
    (dict(n_heads=0), "n_heads"),
    (dict(vocab_size=-1), "vocab_size"),
    (dict(seq_len=0), "seq_len"),
    (dict(d_ff=0), "d_ff"),
    (dict(n_layers=2.5), "n_layers"),
    (dict(d_model=66, n_heads=4), "d_model"),
    (dict(seed=1.5), "ModelConfig.seed"),           # torch would only fail later, deep inside
    (dict(tie_embeddings="yes"), "tie_embeddings"),
])
def test_bad_config_names_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        pl.ModelConfig(**fields)


def test_bad_layer_ranges():
    with pytest.raises(ValueError, match="layer index"):
        pl.build_layer(SMALL, SMALL.total_layers)
    with pytest.raises(ValueError, match="start"):
        pl.build_layers(SMALL, 3, 3)
    with pytest.raises(ValueError, match="stop"):
        pl.build_layers(SMALL, 0, SMALL.total_layers + 1)


@pytest.mark.parametrize("cfg", [
    pl.ModelConfig(),
    SMALL,
    pl.ModelConfig(n_layers=2, d_model=48, n_heads=3, d_ff=100, vocab_size=60, seq_len=24),
    pl.ModelConfig(n_layers=2, d_model=32, tie_embeddings=True),
])
def test_layer_costs_match_real_parameter_counts(cfg):
    model = pl.ToyGPT(cfg)
    rows = pl.layer_costs(cfg)
    assert [r["index"] for r in rows] == list(range(cfg.total_layers))
    assert sum(r["params"] for r in rows) == sum(p.numel() for p in model.parameters())
    if not cfg.tie_embeddings:
        for row, layer in zip(rows, model.layers):
            assert row["params"] == sum(p.numel() for p in layer.parameters()), row["name"]
    assert model.layer_costs() == rows


def test_block_flops_follow_the_closed_form_and_scale_with_batch():
    cfg = pl.ModelConfig()
    s, h = cfg.seq_len, cfg.d_model
    for b in (1, 4):
        block = pl.layer_costs(cfg, batch_size=b)[1]
        assert block["flops"] == s * b * h * (24 * h + 4 * s)
    head = pl.layer_costs(cfg, batch_size=3)[-1]
    assert head["flops"] == 2 * s * 3 * h * cfg.vocab_size


def test_booleans_are_not_sizes_and_long_sequences_are_refused():
    with pytest.raises(ValueError, match="n_layers"):
        pl.ModelConfig(n_layers=True)
    model = pl.ToyGPT(pl.ModelConfig(seq_len=8))
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))
