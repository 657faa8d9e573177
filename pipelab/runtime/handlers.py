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
    """Input-gradient half: d loss / d input, keeping the graph for the weight half (W)."""
    s, mb = a.stage, a.microbatch
    inp, out = state.saved[(s, mb)]
    grad = None if s == state.last_stage else state.take(state.grad_producer(s + 1, mb))
    state.output_grads[(s, mb)] = grad
    if s == 0:                     # token ids have no gradient: nothing to do until W
        return None
    (input_grad,) = torch.autograd.grad(out, [inp], grad, retain_graph=True)
    return input_grad


@register_handler("W")
def weight_backward(state: StepState, a: Action) -> None:
    """Weight-gradient half: walks the graph kept by I again, into the parameters only.

    This recomputes the intermediate gradients I already computed (an honest but not optimal
    split: real zero-bubble runtimes keep them); it frees the graph, as a full B does.
    """
    s, mb = a.stage, a.microbatch
    _inp, out = state.saved.pop((s, mb))
    grad = state.output_grads.pop((s, mb))
    params = [p for p in state.module(s).parameters() if p.requires_grad]
    torch.autograd.backward(out, grad, inputs=params)
    return None
