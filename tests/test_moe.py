"""The mixture-of-experts MLP against a plain loop over experts; capacity, drops and ties."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import pipelab as pl
from pipelab.model.moe import MoEMLP, capacity, loss_share


def _layer(E=4, k=2, c=1.25, coef=0.01, d=16, f=32, seed=0) -> MoEMLP:
    torch.manual_seed(seed)
    layer = MoEMLP(d, f, E, k, c, coef)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return layer


def plain_loop(layer: MoEMLP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, written without sorting or gathering: for each group, walk the
    assignments first choices first, token by token, count each expert's load, and add
    gate · expert(token) while the expert has room. Returns (output, aux loss)."""
    b, s, _d = x.shape
    E, k = layer.n_experts, layer.top_k
    probs = layer.router(x).softmax(-1)
    room = math.ceil(layer.capacity_factor * s * k / E)
    out = torch.zeros_like(x)
    aux = 0.0
    for g in range(b):
        ranked = [sorted(range(E), key=lambda e: (-probs[g, t, e].item(), e)) for t in range(s)]
        load = [0] * E
        routed = [0] * E
        for j in range(k):
            for t in range(s):
                e = ranked[t][j]
                routed[e] += 1
                if load[e] < room:
                    load[e] += 1
                    out[g, t] = out[g, t] + probs[g, t, e] * layer.experts[str(e)](x[g, t:t + 1])[0]
        aux = aux + sum(routed[e] / (k * s) * probs[g, :, e].mean() for e in range(E))
    return out, layer.aux_loss_coef * E * aux / b


@pytest.mark.parametrize("E,k,c", [(4, 2, 1.25), (4, 1, 0.5), (8, 3, 1.0), (3, 3, 2.0)])
def test_layer_equals_a_plain_loop_over_experts(E, k, c) -> None:
    layer = _layer(E, k, c)
    x = torch.randn(3, 10, 16, requires_grad=True)
    y = layer(x)
    want, aux = plain_loop(layer, x)
    # float32 sums of k expert outputs in another order (batched rows against one token at a
    # time): the BLAS kernel this CPU picks moved one element by 1.4e-6 on a value near 0; a
    # routing or weighting mistake moves outputs by 1e-2 and more.
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.last.aux, aux, rtol=1e-5, atol=1e-7)
    # Gradients of the whole objective (a loss on the output plus the aux loss), parameter by
    # parameter and for the input: the aux loss's gradient comes in through the output.
    w = torch.randn_like(y)
    got = torch.autograd.grad((y * w).sum(), [x, *layer.parameters()], allow_unused=True)
    ref = torch.autograd.grad((want * w).sum() + aux, [x, *layer.parameters()], allow_unused=True)
    for name, g, r in zip(["input"] + [n for n, _ in layer.named_parameters()], got, ref):
        if r is None:
            assert g is None or not g.any(), name
            continue
        # the project's measure: max error relative to the largest reference entry
        assert (g - r).abs().max() <= 1e-5 * r.abs().max(), name


def test_capacity_is_the_ceiling_of_the_formula() -> None:
    assert capacity(10, 4, 2, 1.25) == 7            # 6.25 -> 7
    assert capacity(32, 4, 1, 1.0) == 8             # exact: no rounding up
    assert capacity(5, 8, 1, 1.0) == 1              # 0.625 -> 1
    assert capacity(7, 3, 2, 0.5) == 3              # 2.33 -> 3


def test_ties_go_to_the_lower_expert_and_overflow_is_dropped_in_token_order() -> None:
    """A zero router gives every expert probability 1/E: every token picks experts 0..k-1, and
    each takes the first ⌈c·s·k/E⌉ tokens of a sequence; the rest of them are dropped."""
    E, k, c, s = 4, 2, 1.0, 10
    layer = _layer(E, k, c)
    with torch.no_grad():
        layer.router.weight.zero_()
    x = torch.randn(2, s, 16)
    y = layer(x)
    r = layer.last
    room = math.ceil(c * s * k / E)                  # 5
    assert r.capacity == room
    assert (r.expert[:, 0] == 0).all() and (r.expert[:, 1] == 1).all()
    kept = torch.arange(s) < room
    assert torch.equal(r.kept, kept.expand(2, k, s))
    assert r.routed.tolist() == [[s, s, 0, 0]] * 2
    assert r.dropped.tolist() == [[s - room, s - room, 0, 0]] * 2
    # Tokens past capacity get nothing from the MLP: they pass through the block's residual.
    assert not y[:, room:].any()
    both = (layer.experts["0"](x[:, :room]) + layer.experts["1"](x[:, :room])) / E
    torch.testing.assert_close(y[:, :room], both)


def test_ties_among_many_experts_follow_the_index_not_the_sort() -> None:
    """With 32 experts in tied blocks of 8 (identical router rows), every token's top-4 are
    the four lowest indices of its best block. torch's default (unstable) sort reorders equal
    keys at this width, so this catches a routing whose tie rule hangs on sort internals; the
    plain loop breaks ties by index explicitly."""
    E, k = 32, 4
    layer = _layer(E, k, c=1.0, d=8, f=8)
    with torch.no_grad():
        block = torch.randn(E // 8, 8)
        layer.router.weight.copy_(block.repeat_interleave(8, dim=0))
    x = torch.randn(2, 12, 8)
    y = layer(x)
    best = (x @ block.T).argmax(-1)                              # (2, 12) the winning block
    want = best.unsqueeze(1) * 8 + torch.arange(k).view(1, k, 1)  # (2, k, 12)
    assert torch.equal(layer.last.expert, want)
    ref, _aux = plain_loop(layer, x)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_second_choices_queue_behind_first_choices() -> None:
    """Tokens 0-3 prefer expert 0 then 1, tokens 4-5 expert 1 then 0; capacity 4. Second
    choices queue behind every first choice: expert 1 holds 4, 5 (first) and then 0, 1
    (second), dropping 2, 3; expert 0 holds 0-3 and drops the second choices of 4, 5."""
    layer = _layer(E=3, k=2, c=1.0, d=4)
    logits = torch.tensor([[3.0, 2.0, 0.0]] * 4 + [[2.0, 3.0, 0.0]] * 2)   # 6 tokens
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(3, 4))
    x = torch.cat([logits, torch.zeros(6, 1)], 1).unsqueeze(0)
    layer(x)
    r = layer.last
    assert r.capacity == 4                           # ⌈1.0 · 6 · 2 / 3⌉
    assert r.kept[0, 0].tolist() == [True] * 6
    assert r.kept[0, 1].tolist() == [True] * 2 + [False] * 4
    assert r.dropped[0].tolist() == [2, 2, 0]


def test_aux_loss_is_alpha_when_balanced_and_grows_with_imbalance() -> None:
    layer = _layer(E=4, k=1, coef=0.1, d=4)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4) * 50)     # token t -> expert argmax(x_t)
    x = torch.eye(4).repeat(1, 2, 1)                     # 8 tokens, 2 per expert, ~sure
    layer(x)
    assert layer.last.aux.item() == pytest.approx(0.1, rel=1e-4)
    layer(torch.eye(4)[[0] * 8].unsqueeze(0))            # all to expert 0
    assert layer.last.aux.item() == pytest.approx(0.1 * 4, rel=1e-4)


def test_aux_loss_gradient_follows_the_loss_share() -> None:
    layer = _layer()
    x = torch.randn(2, 6, 16)
    (g1,) = torch.autograd.grad(layer(x).sum() * 0, [layer.router.weight])
    with loss_share(0.25):
        (g4,) = torch.autograd.grad(layer(x).sum() * 0, [layer.router.weight])
    torch.testing.assert_close(g4, g1 * 0.25)
    assert g1.abs().max() > 0


def test_aux_scale_is_fixed_by_the_forward_even_when_recomputed() -> None:
    """Under recomputation the backward (and the forward's re-run) happen after the F action
    left its `loss_share`: the aux gradient must keep the scale the first forward saw."""
    from torch.utils.checkpoint import checkpoint
    layer = _layer()
    x = torch.randn(2, 6, 16)
    with loss_share(0.25):
        (ref,) = torch.autograd.grad(layer(x).sum() * 0, [layer.router.weight])
        y = checkpoint(layer, x, use_reentrant=False)
    (got,) = torch.autograd.grad(y.sum() * 0, [layer.router.weight])  # outside the share
    torch.testing.assert_close(got, ref)
    with loss_share(0.5):                                   # a different share at backward
        y = checkpoint(layer, x, use_reentrant=False)
    with loss_share(1.0):
        (again,) = torch.autograd.grad(y.sum() * 0, [layer.router.weight])
    torch.testing.assert_close(again, ref * 2)


def test_routing_ignores_the_rest_of_the_batch() -> None:
    """Capacity is per sequence: routing a sequence alone or in a batch gives the same output
    (which is what makes microbatches and replicas exact)."""
    layer = _layer(c=0.75)
    x = torch.randn(4, 12, 16)
    whole = layer(x)
    dropped = layer.last.dropped.sum()
    torch.testing.assert_close(torch.cat([layer(x[i:i + 1]) for i in range(4)]), whole)
    assert dropped > 0            # capacity bites, so a batch-wide capacity would differ


def test_moe_model_trains_and_dense_is_unchanged() -> None:
    dense = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2)
    assert pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, n_experts=0).moe is False
    names = [n for n, _ in pl.ToyGPT(dense).named_parameters()]
    assert "layers.1.up.weight" in names
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, n_experts=4, top_k=2)
    model = pl.ToyGPT(cfg)
    rows = pl.layer_costs(cfg)
    assert rows[1]["params"] == sum(p.numel() for p in model.layers[1].parameters())
    losses = pl.train(cfg, steps=15, batch_size=8, progress=False)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("kw,words", [
    (dict(n_experts=4, top_k=5), "top_k (5) must be at most n_experts (4)"),
    (dict(n_experts=-1), "n_experts must be None, 0"),
    (dict(n_experts=2.0), "n_experts must be None, 0"),
    (dict(n_experts=4, capacity_factor=0), "capacity_factor must be a positive number"),
    (dict(n_experts=4, capacity_factor=-1.0), "capacity_factor must be a positive number"),
    (dict(n_experts=4, top_k=0), "top_k must be a positive integer"),
    (dict(n_experts=4, aux_loss_coef=-0.1), "aux_loss_coef must be a finite number >= 0"),
])
def test_bad_configs_are_refused(kw, words) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        pl.ModelConfig(**kw)
