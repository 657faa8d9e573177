"""Braided steps: one microbatch's tensor-parallel all-reduce runs while another one computes.

Inside a compound step (STP's F+F, F+B, F+I, F+W) the executor runs the parts' *braided*
handlers side by side: each is a generator that yields where it would otherwise wait, and the
executor lets the other part compute meanwhile (runtime/handlers.py, HandlerSpec.braid).

    F   a block's attention, up to its row-parallel output: launch the all-reduce of the partial
        sums (`async_op=True`), yield; when resumed, wait for it, add the residual; the same
        for the MLP. So a braided forward has its all-reduces in flight while the other part
        computes (the paper's F.attn(a) | B.mlp(b) | … braid).
    W   the deferred weight GEMMs one Linear at a time, yielding in between: a forward's
        all-reduce can run under them.

B and I run whole, their all-reduces synchronous inside autograd (splitting a backward at the
all-reduce would need the graph cut at every sub-layer): their compute still hides the
forward's all-reduce, which is the F+B braid's first half. The arithmetic is the unbraided
handlers' (the same sums, each added once), so the gradients are bit-identical.
"""
from __future__ import annotations

import torch

from ..runtime.handlers import forward_input, forward_output, register_braid
from .tensor import TensorParallelBlock


class _Summed(torch.autograd.Function):
    """Megatron's g with the sum done outside: forward, the already-summed tensor; backward,
    the gradient goes to the partial sums unchanged (as g's identity backward)."""

    @staticmethod
    def forward(ctx, partial, total):
        return total.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@register_braid("F")
def forward_braided(state, a, inputs: dict):
    inp = x = forward_input(state, a, inputs)
    for layer in state.module(a.stage, a.microbatch):
        if not isinstance(layer, TensorParallelBlock):
            with state.meter.saving():
                x = layer(x)
            continue
        for sublayer in (layer.attention_partial, layer.mlp_partial):
            with state.meter.saving():       # (never held across a yield: the hooks are global)
                partial = sublayer(x)
            total = partial.detach().clone()
            pending = layer.proj.tp.all_reduce(total, "forward, async", async_op=True)
            yield                             # the other part computes while the sum travels
            pending.wait()
            with state.meter.saving():
                x = x + _Summed.apply(partial, total)
    return forward_output(state, a, inp, x)


@register_braid("W")
def weight_braided(state, a, inputs: dict):
    yield from state.weight_grads.flush_steps(a.stage, a.microbatch)
    return None
