"""What each action kind computes. The executor looks handlers up by kind, so a later chapter
adds a kind (a vocabulary pass, an all-to-all, a recomputation) by registering one handler
next to its `register_kind`.

A handler gets the step state, the action and its inputs — a dict from input name (as the
kind spec names its edges: "x", "grad", …) to the tensor that arrived from another rank or was
handed over by a stage on this rank — and returns what it produces for other actions (a
tensor, or None). The executor sends that to every consumer the communication plan lists.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from ..model import loss_fn
from ..schedules import Action
from .stage import StepState

Handler = Callable[[StepState, Action, dict], "torch.Tensor | None"]
# (run spec, producing action) -> (shape, dtype) of what it sends; None: the stage boundary's
OutputShape = Callable[[object, Action], tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class HandlerSpec:
    run: Handler
    output: OutputShape | None = None
    module: str = "pipelab"          # the workers import it from there


HANDLERS: dict[str, HandlerSpec] = {}


def register_handler(kind: str, output: OutputShape | None = None) -> Callable[[Handler], Handler]:
    """Decorator: `@register_handler("F")` makes the function run every `F` action.

    `output(spec, action)` gives the shape and dtype of what the kind sends, when that is not
    the stage boundary's (rows, seq_len, d_model) float32."""
    def add(handler: Handler) -> Handler:
        module = getattr(handler, "__module__", None) or inspect.getmodule(handler).__name__
        HANDLERS[kind] = HandlerSpec(handler, output, module)
        return handler
    return add


@register_handler("F")
def forward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    s, mb = a.stage, a.microbatch
    x, y = state.microbatches[mb]
    inp = inputs["x"].requires_grad_() if "x" in inputs else x
    with state.meter.saving():
        out = state.module(s)(inp)
        if s == state.last_stage:
            loss = loss_fn(out, y)
            state.losses[mb] = loss.item()
            out = loss / state.m          # so the microbatch gradients sum to the batch mean's
    state.saved[(s, mb)] = (inp, out)
    return None if s == state.last_stage else out.detach()


@register_handler("B")
def backward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    """Full backward: gradient of the stage input (sent back) and of the weights (accumulated)."""
    inp, out = state.saved.pop((a.stage, a.microbatch))
    # The last stage's output is the scaled loss: its backward starts from 1, not a message.
    torch.autograd.backward(out, inputs.get("grad"))
    return inp.grad if a.stage > 0 else None


@register_handler("I")
def input_backward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    """Input-gradient half: d loss / d input, keeping the graph for the weight half (W)."""
    s, mb = a.stage, a.microbatch
    inp, out = state.saved[(s, mb)]
    grad = inputs.get("grad")
    state.output_grads[(s, mb)] = grad
    if s == 0:                     # token ids have no gradient: nothing to do until W
        return None
    (input_grad,) = torch.autograd.grad(out, [inp], grad, retain_graph=True)
    return input_grad


@register_handler("W")
def weight_backward(state: StepState, a: Action, inputs: dict) -> None:
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
