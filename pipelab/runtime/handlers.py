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

from ..schedules import Action
from ..schedules.kinds import OFFLOAD, RELOAD
from ..support.registry import claim
from .stage import StepState

Handler = Callable[[StepState, Action, dict], "torch.Tensor | None"]
# (run spec, producing action) -> (shape, dtype) of what it sends; None: the stage boundary's
OutputShape = Callable[[object, Action], tuple[tuple[int, ...], torch.dtype]]


# (run spec, pipeline rank, its RankStages) -> None: adapts what the rank holds before a run
Setup = Callable[[object, int, object], None]


@dataclass(frozen=True)
class HandlerSpec:
    run: Handler
    output: OutputShape | None = None
    module: str = "pipelab"          # the workers import it from there
    setup: Setup | None = None
    # Inside a compound step, this version (a generator function) runs instead: it yields
    # wherever it waits on asynchronous work, and the executor runs the step's other parts
    # meanwhile (braiding); what it returns is what `run` would. None: run it whole.
    braid: Callable | None = None


def register_braid(kind: str) -> Callable:
    """Decorator: the braided version of an existing kind's handler (see HandlerSpec.braid)."""
    def add(generator: Callable) -> Callable:
        from dataclasses import replace
        HANDLERS[kind] = replace(HANDLERS[kind], braid=generator)
        return generator
    return add


HANDLERS: dict[str, HandlerSpec] = {}


def register_handler(kind: str, output: OutputShape | None = None,
                     setup: Setup | None = None,
                     replace: bool = False) -> Callable[[Handler], Handler]:
    """Decorator: `@register_handler("F")` makes the function run every `F` action.

    `output(spec, action)` gives the shape and dtype of what the kind sends, when that is not
    the stage boundary's (rows, seq_len, d_model) float32. `setup(spec, rank, stages)` runs once
    per run on each rank whose schedule uses the kind, before its first step: a kind that needs
    parameters of its own (a vocabulary shard) adds them to the rank's stages there.
    A kind whose handler another module registered is replaced only with `replace=True`."""
    def add(handler: Handler) -> Handler:
        module = getattr(handler, "__module__", None) or inspect.getmodule(handler).__name__
        old = HANDLERS.get(kind)
        claim("handler of kind", kind, module, old and old.module, replace)
        HANDLERS[kind] = HandlerSpec(handler, output, module, setup)
        return handler
    return add


def run_setups(spec, rank: int, stages) -> None:
    """Each distinct setup of the schedule's kinds, once, in a fixed order."""
    done = []
    for kind in sorted(spec.schedule.kinds()):
        setup = HANDLERS[kind].setup
        if setup is not None and setup not in done:
            done.append(setup)
            setup(spec, rank, stages)


@register_handler("F")
def forward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    inp = forward_input(state, a, inputs)
    with state.saving(a.stage, a.microbatch):
        out = state.forward(a.stage, a.microbatch, inp)
    return forward_output(state, a, inp, out)


def forward_input(state: StepState, a: Action, inputs: dict) -> torch.Tensor:
    """What a forward reads: the activation that arrived, or the microbatch's inputs."""
    if "x" not in inputs:
        return state.microbatches[a.microbatch][0]
    crossing = state.stages.inbound.get(a.stage)
    return inputs["x"].requires_grad_() if crossing is None else crossing.unpack(inputs["x"])


def forward_output(state: StepState, a: Action, inp: torch.Tensor,
                   out: torch.Tensor) -> torch.Tensor | None:
    """Keep what the backward needs; on the last stage (when the loss is computed there) turn
    the logits into the scaled loss."""
    s, mb = a.stage, a.microbatch
    ends_in_loss = s in state.last_stages and state.loss_on_last_stage
    if ends_in_loss:
        with state.saving(s, mb):
            loss = state.stages.model.loss(out, state.microbatches[mb][1])
        state.losses[mb] = loss.item()
        # So the microbatch gradients (summed over the replicas) are the batch mean's.
        out = loss / (state.m * state.replicas)
    state.saved[(s, mb)] = (inp, out)
    if ends_in_loss:
        return None
    crossing = state.stages.outbound.get(s)
    return out.detach() if crossing is None else crossing.pack(out)


def stage_backward(state: StepState, s: int, out, grad) -> None:
    """autograd's backward from the stage's output `out` (the scaled loss, when `grad` is None)
    with the gradient message that came back."""
    crossing = state.stages.outbound.get(s)
    if crossing is None or grad is None:
        torch.autograd.backward(out, grad)
        return
    tensors, grads = crossing.backward_pairs(out, grad)
    if tensors:                  # integer outputs only: nothing flows back through them
        torch.autograd.backward(tensors, grads)


def input_gradient(state: StepState, s: int, inp) -> torch.Tensor | None:
    """What a backward sends to the stage before: the gradient of the stage's input."""
    if s in state.first_stages:
        return None
    crossing = state.stages.inbound.get(s)
    return inp.grad if crossing is None else crossing.pack_gradient(inp)


@register_handler("B")
def backward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    """Full backward: gradient of the stage input (sent back) and of the weights (accumulated)."""
    inp, out = state.saved.pop((a.stage, a.microbatch))
    # The last stage's output is the scaled loss: its backward starts from 1, not a message.
    stage_backward(state, a.stage, out, inputs.get("grad"))
    return input_gradient(state, a.stage, inp)


@register_handler("I")
def input_backward(state: StepState, a: Action, inputs: dict) -> torch.Tensor | None:
    """Input-gradient half: the backward of the whole stage, except that each Linear leaves its
    weight GEMMs (with the input and output gradient they need) in the store for W. LayerNorm
    and embedding gradients, cheap, are done here. The graph is freed, as after a full B."""
    s, mb = a.stage, a.microbatch
    inp, out = state.saved.pop((s, mb))
    with state.weight_grads.deferring(s, mb):
        stage_backward(state, s, out, inputs.get("grad"))
    return input_gradient(state, s, inp)


@register_handler("W")
def weight_backward(state: StepState, a: Action, inputs: dict) -> None:
    """Weight-gradient half: just the GEMMs dW = dyᵀ·x (and db = Σ dy) that I left behind."""
    state.weight_grads.flush(a.stage, a.microbatch)
    return None


@register_handler(OFFLOAD)
def offload(state: StepState, a: Action, inputs: dict) -> None:
    """Move the forward's saved activations off the device (stage.py's OffloadStore)."""
    state.offloads.offload(a.stage, a.microbatch)
    return None


@register_handler(RELOAD)
def reload(state: StepState, a: Action, inputs: dict) -> None:
    """Bring them back, counted again, before the backward reads them."""
    state.offloads.reload(a.stage, a.microbatch)
    return None
