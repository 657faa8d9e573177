"""What each action kind computes. The executor looks handlers up by kind, so a later issue
adds a kind (a fused F&B, a vocabulary pass, an all-to-all) by registering one handler.

A handler gets the step state and the action, takes its inputs with `state.take(producer)`,
and returns what it produces for other stages (a tensor, or None); the executor sends it to
every consumer the communication plan lists.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..model import loss_fn
from ..schedules import Action
from .stage import StepState

Handler = Callable[[StepState, Action], "torch.Tensor | None"]
HANDLERS: dict[str, Handler] = {}


def register_handler(kind: str) -> Callable[[Handler], Handler]:
    """Decorator: `@register_handler("F")` makes the function run every `F` action."""
    def add(handler: Handler) -> Handler:
        HANDLERS[kind] = handler
        return handler
    return add


@register_handler("F")
def forward(state: StepState, a: Action) -> torch.Tensor | None:
    s, mb = a.stage, a.microbatch
    x, y = state.microbatches[mb]
    inp = x if s == 0 else state.take(Action(s - 1, "F", mb)).requires_grad_()
    with state.meter.saving():
        out = state.module(s)(inp)
        if s == state.last_stage:
            loss = loss_fn(out, y)
            state.losses[mb] = loss.item()
            out = loss / state.m          # so the microbatch gradients sum to the batch mean's
    state.saved[(s, mb)] = (inp, out)
    return None if s == state.last_stage else out.detach()


@register_handler("B")
def backward(state: StepState, a: Action) -> torch.Tensor | None:
    """Full backward: gradient of the stage input (sent back) and of the weights (accumulated)."""
    s, mb = a.stage, a.microbatch
    inp, out = state.saved.pop((s, mb))
    # The last stage's output is the scaled loss: its backward starts from 1, not a message.
    grad = None if s == state.last_stage else state.take(state.grad_producer(s + 1, mb))
    torch.autograd.backward(out, grad)
    return inp.grad if s > 0 else None


@register_handler("I")
def input_backward(state: StepState, a: Action) -> torch.Tensor | None:
    """Input-gradient half: the backward of the whole stage, except that each Linear leaves its
    weight GEMMs (with the input and output gradient they need) in the store for W. LayerNorm
    and embedding gradients, cheap, are done here. The graph is freed, as after a full B."""
    s, mb = a.stage, a.microbatch
    inp, out = state.saved.pop((s, mb))
    grad = None if s == state.last_stage else state.take(state.grad_producer(s + 1, mb))
    with state.weight_grads.deferring(s, mb):
        torch.autograd.backward(out, grad)
    return inp.grad if s > 0 else None


@register_handler("W")
def weight_backward(state: StepState, a: Action) -> None:
    """Weight-gradient half: just the GEMMs dW = dyᵀ·x (and db = Σ dy) that I left behind."""
    state.weight_grads.flush(a.stage, a.microbatch)
    return None
