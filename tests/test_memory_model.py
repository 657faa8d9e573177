"""The analytic byte model (memory.py) against what the model really allocates and saves."""
import pytest
import torch

import pipelab as pl
from pipelab.model import memory
from pipelab.model.gpt import loss_fn
from pipelab.runtime.meter import ActivationMeter
from pipelab.model.weight_grad import WeightGradStore

CONFIGS = [pl.ModelConfig(n_layers=3, d_model=32, n_heads=4, seq_len=16, vocab_size=40),
           pl.ModelConfig(n_layers=2, d_model=24, n_heads=2, d_ff=40, seq_len=12, vocab_size=30)]


def _metered_forward(cfg, start, stop, rows):
    """(meter, layers, output) after one forward of layers [start, stop) on `rows` sequences."""
    layers = pl.build_layers(cfg, start, stop)
    meter = ActivationMeter(layers.parameters())
    x, y = pl.get_batch(rows, cfg.seq_len, seed=1)
    x, y = x % cfg.vocab_size, y % cfg.vocab_size
    inp = x if start == 0 else torch.randn(rows, cfg.seq_len, cfg.d_model, requires_grad=True)
    with meter.saving():
        out = layers(inp)
        if stop == cfg.total_layers:
            out = loss_fn(out, y)
    return meter, layers, out


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("rows", [1, 3])
def test_activation_bytes_equal_the_meter_byte_for_byte(cfg, rows):
    n = cfg.total_layers
    for start, stop in [(0, 1), (1, 2), (1, n - 1), (n - 1, n), (0, n), (0, 2)]:
        meter, _, _ = _metered_forward(cfg, start, stop, rows)
        assert memory.activation_bytes(cfg, start, stop, rows) == meter.live, (start, stop)


def test_block_saved_names_the_attention_probabilities_as_the_seq_squared_term():
    cfg = CONFIGS[0]
    one, two = memory.block_saved(cfg, 1), memory.block_saved(pl.ModelConfig(
        n_layers=3, d_model=32, n_heads=4, seq_len=32, vocab_size=40), 1)
    # doubling the sequence doubles every per-token tensor and quadruples the s² ones
    for name in one:
        factor = 4 if name in ("attention probabilities", "causal mask") else 2
        assert two[name] == factor * one[name], name


@pytest.mark.parametrize("cfg", CONFIGS)
def test_weight_grad_bytes_equal_what_I_leaves_for_W(cfg):
    n, rows = cfg.total_layers, 2
    for start, stop in [(1, n - 1), (1, n), (n - 1, n)]:
        meter, _, out = _metered_forward(cfg, start, stop, rows)
        store = WeightGradStore(meter)
        with store.deferring(0, 0):
            torch.autograd.backward(out, None if stop == n else torch.randn_like(out))
        assert memory.weight_grad_bytes(cfg, start, stop, rows) == store.nbytes() == meter.live


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_and_adamw_bytes_equal_the_real_ones(tied):
    cfg = pl.ModelConfig(n_layers=3, d_model=16, n_heads=2, seq_len=8, tie_embeddings=tied)
    n = cfg.total_layers
    for start, stop in [(0, 1), (1, 3), (3, n), (0, n), (n - 1, n)]:
        layers = pl.build_layers(cfg, start, stop)
        params = list(layers.parameters())          # a tied weight appears once
        assert memory.parameter_bytes(cfg, start, stop) == sum(p.numel() * 4 for p in params)
        opt = torch.optim.AdamW(params)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
        assert memory.optimizer_bytes(cfg, start, stop) == state, (start, stop)
        assert memory.optimizer_bytes(cfg, start, stop, "sgd") == 0


def test_policies_order_and_every_k_interpolates():
    cfg = pl.ModelConfig(n_layers=9, d_model=32, n_heads=4, seq_len=64)
    by = {p: memory.activation_bytes(cfg, 1, 10, 2, p) for p in ("none", "selective", "full")}
    assert by["full"] < by["selective"] < by["none"]
    # every-k keeps ceil(9/k) block inputs: k=1 is full, k=3 (√9, the default) a third of it
    assert memory.activation_bytes(cfg, 1, 10, 2, "every-k", 1) == by["full"]
    assert memory.activation_bytes(cfg, 1, 10, 2, "every-k") * 3 == by["full"]


@pytest.mark.parametrize("call, match", [
    (lambda c: memory.activation_bytes(c, 0, 9, 2), "start < stop"),
    (lambda c: memory.activation_bytes(c, 0, 2, 0), "rows"),
    (lambda c: memory.activation_bytes(c, 0, 2, 2, "some"), "recompute policy"),
    (lambda c: memory.activation_bytes(c, 0, 2, 2, "full", k=2), "only for policy 'every-k'"),
    (lambda c: memory.activation_bytes(c, 0, 2, 2, "every-k", k=0), "k .* >= 1"),
    (lambda c: memory.optimizer_bytes(c, 0, 2, "lion"), "optimizer"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(CONFIGS[0])
