"""The weight-gradient pass is real: I computes input gradients and stores (x, dy) for each Linear,
W runs just the weight GEMMs, the gradients are those of a full backward, and the meter sees it.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import pipelab as pl
from pipelab.runtime.meter import ActivationMeter
from pipelab.model.weight_grad import Linear, WeightGradStore

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)   # layers E, t, t, t, t, L


def _twins(bias: bool) -> tuple[nn.Linear, Linear]:
    torch.manual_seed(0)
    ref = nn.Linear(6, 10, bias=bias)
    ours = Linear(6, 10, bias=bias)
    ours.load_state_dict(ref.state_dict())
    with torch.no_grad():                       # a bias that is not zero, to be seen in dy·W
        for p in ours.parameters():
            p.add_(0.1)
        for p in ref.parameters():
            p.add_(0.1)
    return ref, ours


@pytest.mark.parametrize("shape", [(9, 6), (3, 5, 6)], ids=["2-D", "3-D"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_one_linear_input_grad_now_weight_grad_later(shape, bias):
    ref, ours = _twins(bias)
    x = torch.randn(*shape, requires_grad=True)
    x_ours = x.detach().clone().requires_grad_()
    dy = torch.randn(*shape[:-1], 10)
    y = ref(x)
    y.backward(dy)

    y_ours = ours(x_ours)
    assert torch.equal(y_ours, y)
    store = WeightGradStore()
    with store.deferring(0, 0):
        y_ours.backward(dy)
    assert torch.equal(x_ours.grad, x.grad)                  # dX now...
    assert all(p.grad is None for p in ours.parameters())    # ...and no weight work yet
    assert store.pending() == [(0, 0)]
    store.flush(0, 0)                                        # dW later
    assert torch.equal(ours.weight.grad, ref.weight.grad)
    if bias:
        assert torch.equal(ours.bias.grad, ref.bias.grad)
    assert store.pending() == []


def test_without_deferral_it_is_nn_linear():
    ref, ours = _twins(True)
    x = torch.randn(2, 4, 6, requires_grad=True)
    x_ours = x.detach().clone().requires_grad_()
    ref(x).square().sum().backward()
    ours(x_ours).square().sum().backward()
    assert torch.equal(x_ours.grad, x.grad)
    assert torch.equal(ours.weight.grad, ref.weight.grad)
    assert torch.equal(ours.bias.grad, ref.bias.grad)


def test_model_keeps_names_and_weights():
    model = pl.ToyGPT(CFG)
    linears = [name for name, m in model.named_modules() if isinstance(m, Linear)]
    assert linears[:4] == ["layers.1.qkv", "layers.1.proj", "layers.1.up", "layers.1.down"]
    assert linears[-1] == "layers.5.out" and len(linears) == 4 * CFG.n_layers + 1
    assert all(isinstance(model.get_submodule(n), nn.Linear) for n in linears)
    stage = pl.build_layers(CFG, 2, 4)
    for name, p in stage.state_dict().items():
        local, rest = name.split(".", 1)
        assert torch.equal(p, model.state_dict()[f"layers.{int(local) + 2}.{rest}"])


def _stage_io(bounds: tuple[int, int], seed: int = 0):
    """A stage's input and, unless it ends with the head, a gradient for its output."""
    gen = torch.Generator().manual_seed(seed)
    start, stop = bounds
    if start == 0:
        inp = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=gen)
    else:
        inp = torch.randn(2, CFG.seq_len, CFG.d_model, generator=gen)
    targets = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=gen)
    grad = (None if stop == CFG.total_layers
            else torch.randn(2, CFG.seq_len, CFG.d_model, generator=gen))
    return inp, targets, grad


def _forward(module, inp, targets, meter=None):
    leaf = inp if inp.dtype == torch.long else inp.clone().requires_grad_()
    with meter.saving() if meter is not None else torch.enable_grad():
        out = module(leaf)
        if isinstance(module[-1], pl.model.Head):
            out = pl.loss_fn(out, targets)
    return leaf, out


@pytest.mark.parametrize("bounds", [(0, 1), (0, 3), (2, 4), (3, 6)],
                         ids=["embedding", "E+t*2", "t*2", "t*2+L"])
def test_stage_input_then_weight_pass_equals_full_backward(bounds):
    """Two microbatches each way (their gradients add up in .grad), I0 I1 W1 W0 against B0 B1."""
    full, split = pl.build_layers(CFG, *bounds), pl.build_layers(CFG, *bounds)
    ios = [_stage_io(bounds, seed) for seed in (1, 2)]
    full_inputs, split_inputs = [], []
    for inp, targets, grad in ios:
        leaf, out = _forward(full, inp, targets)
        torch.autograd.backward(out, grad)
        full_inputs.append(leaf)
    store = WeightGradStore()
    outs = [_forward(split, inp, targets) for inp, targets, _ in ios]
    for mb, ((leaf, out), (_, _, grad)) in enumerate(zip(outs, ios)):
        with store.deferring(1, mb):
            torch.autograd.backward(out, grad)
        split_inputs.append(leaf)
    for full_leaf, split_leaf in zip(full_inputs, split_inputs):   # input gradients at I
        if full_leaf.dtype != torch.long:
            assert torch.equal(split_leaf.grad, full_leaf.grad)
    store.flush(1, 1)
    store.flush(1, 0)
    for (name, p), q in zip(full.named_parameters(), split.parameters()):
        assert torch.equal(q.grad, p.grad), name


def test_whole_tied_model_split_backward_matches():
    """With tied embeddings one weight gets its gradient in two parts (embedding at I, head at W)."""
    cfg = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, tie_embeddings=True)
    full, split = pl.ToyGPT(cfg), pl.ToyGPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    full.loss(idx, idx).backward()
    store = WeightGradStore()
    with store.deferring(0, 0):
        split.loss(idx, idx).backward()
    store.flush(0, 0)
    for (name, p), q in zip(full.named_parameters(), split.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_weight_pass_out_of_order_is_an_error():
    stage = pl.build_layers(CFG, 2, 4)
    inp, targets, grad = _stage_io((2, 4))
    store = WeightGradStore()
    with pytest.raises(RuntimeError, match=r"W\) of stage 1, microbatch 0 ran before its "
                                           r"input-gradient pass \(I\)"):
        store.flush(1, 0)
    _, out = _forward(stage, inp, targets)
    with store.deferring(1, 0):
        torch.autograd.backward(out, grad)
    store.flush(1, 0)
    with pytest.raises(RuntimeError, match=r"W\) of stage 1, microbatch 0 ran twice"):
        store.flush(1, 0)
    with pytest.raises(RuntimeError, match=r"pass \(I\) of stage 1, microbatch 0 ran twice"):
        with store.deferring(1, 0):
            pass
    with store.deferring(1, 1):             # nesting would mix two microbatches' work
        with pytest.raises(RuntimeError, match="being deferred already"):
            with store.deferring(1, 2):
                pass


@pytest.mark.parametrize("bounds", [(0, 3), (2, 4), (3, 6)], ids=["E+t*2", "t*2", "t*2+L"])
def test_meter_falls_at_input_pass_and_empties_at_weight_pass(bounds):
    stage = pl.build_layers(CFG, *bounds)
    inp, targets, grad = _stage_io(bounds)
    meter = ActivationMeter(stage.parameters())
    store = WeightGradStore(meter)
    leaf, out = _forward(stage, inp, targets, meter)
    after_f = meter.live
    with store.deferring(1, 0):
        torch.autograd.backward(out, grad)
    del out, leaf
    after_i = meter.live
    assert 0 < after_i < after_f
    assert after_i == store.nbytes()         # what is left is exactly what W needs
    # Per block W keeps x and dy of qkv, proj, up and down: 16 rows of width d per token.
    tokens, d = 2 * CFG.seq_len, CFG.d_model
    blocks = sum(1 for layer in stage if isinstance(layer, pl.model.Block))
    head = 4 * tokens * (d + CFG.vocab_size) if bounds[1] == CFG.total_layers else 0
    assert after_i == blocks * 16 * 4 * tokens * d + head
    store.flush(1, 0)
    assert meter.live == 0 and store.nbytes() == 0


@pytest.fixture(scope="module")
def cluster():
    with pl.LocalCluster(2, timeout=60) as c:
        yield c


def test_live_split_backward_is_exact_and_frees_memory_at_w(cluster):
    m = 4
    # Stage s: all forwards, then I of every microbatch, then the W in reverse order.
    rows = [" ".join([f"{s}F{i}" for i in range(m)] + [f"{s}I{i}" for i in range(m)] +
                     [f"{s}W{i}" for i in reversed(range(m))]) for s in range(2)]
    sched = pl.Schedule.from_text("\n".join(rows), microbatches=m)
    res = cluster.run(sched, model=CFG, seed=3)
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    for rank in range(2):
        levels = [level for _, level in res.memory[rank][1:]]          # after each action
        kinds = [a.kind for a in sched.actions[rank]]
        after_f, after_i = levels[kinds.index("I") - 1], levels[kinds.index("W") - 1]
        assert 0 < after_i < after_f                    # I freed the part W does not need
        w_levels = levels[kinds.index("W"):]
        assert all(a > b for a, b in zip(w_levels, w_levels[1:]))   # each W frees its share
        assert w_levels[-1] == 0
