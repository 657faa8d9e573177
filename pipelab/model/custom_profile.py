"""A custom model's layers measured one by one: what partitioning and planning read of it.

Each layer is built as a pipeline stage builds it (`CustomModel.build(i, i + 1)`, its Linears
deferring their weight GEMMs), fed what it receives in the whole stack (`layer_inputs`), and run
forward, then backward split as a zero-bubble schedule splits it: the input-gradient pass (I)
under a `WeightGradStore`, then its weight-gradient pass (W, the flush). A layer with no
nn.Linear has W = 0: its parameters' gradients come with I. The last layer's backward starts
from the user's loss; the others' from a fixed random gradient, as one arrives in a pipeline.

Times are the median thread-CPU seconds of `repeats` warm runs on one torch thread (as a worker
runs); bytes are what the forward saves for the backward (each storage once, parameters not
counted), what I leaves for W, and what the layer receives (its checkpoint under recomputation).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..support.threads import one_thread
from .custom import CustomModel
from .weight_grad import WeightGradStore


@dataclass(frozen=True)
class LayerProfile:
    """One layer at one microbatch size: seconds of F, I and W, and bytes."""
    forward: float
    input_grad: float
    weight_grad: float
    saved_bytes: int       # what the forward keeps for the backward
    stash_bytes: int       # what I leaves for W (the Linears' x and dy)
    input_bytes: int       # what the layer receives (a checkpoint's size)

    @property
    def total(self) -> float:
        """F + I + W: the layer's share of a training step."""
        return self.forward + self.input_grad + self.weight_grad


def profile_layers(model: CustomModel, rows: int, repeats: int = 5, warmup: int = 2,
                   seed: int = 0) -> list[LayerProfile]:
    """One LayerProfile per layer of `model` for a microbatch of `rows` rows of
    batch(rows, seed) (see the module docstring)."""
    if not isinstance(model, CustomModel):
        raise ValueError(f"model must be a pl.CustomModel, got {type(model).__name__}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, "
                         f"warmup={warmup}")
    inputs = model.layer_inputs(rows, seed)
    targets = model.batch(rows, seed)[1]
    last = len(inputs) - 1
    gen = torch.Generator().manual_seed(seed)
    out = []
    with one_thread():
        for i, x in enumerate(inputs):
            layer = model.build(i, i + 1)
            grads = None
            samples = []
            for n in range(warmup + repeats):
                store, saved = WeightGradStore(), {}
                given = _leaves(x, grad=True)
                t0 = time.thread_time()
                with torch.autograd.graph.saved_tensors_hooks(_counter(saved, layer), lambda t: t):
                    y = layer(given)
                t1 = time.thread_time()
                roots, grads = _roots(model, y, targets, i == last, grads, gen)
                with store.deferring(0, 0):
                    torch.autograd.backward(roots, grads)
                t2 = time.thread_time()
                stash = store.nbytes()
                store.flush(0, 0)
                t3 = time.thread_time()
                if n >= warmup:
                    samples.append((t1 - t0, t2 - t1, t3 - t2, sum(saved.values()), stash))
            f, i_, w, saved_b, stash_b = (statistics.median(s) for s in zip(*samples))
            out.append(LayerProfile(f, i_, w, int(saved_b), int(stash_b), _nbytes(x)))
    return out


def _leaves(x, grad: bool):
    """A fresh leaf copy of what a layer receives: floating tensors require grad."""
    def one(t):
        t = t.detach().clone()
        return t.requires_grad_(True) if grad and t.is_floating_point() else t
    return one(x) if isinstance(x, torch.Tensor) else type(x)(one(t) for t in x)


def _roots(model, y, targets, last: bool, grads, gen):
    """(tensors to backward from, their gradients): the loss on the last layer, else every
    floating output with a gradient drawn once (the same on every repeat)."""
    if last:
        return [model.loss(y, targets)], None
    outs = [y] if isinstance(y, torch.Tensor) else list(y)
    outs = [t for t in outs if t.requires_grad]
    if grads is None:
        grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in outs]
    return outs, grads


def _counter(saved: dict, layer):
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t
    return pack


def _nbytes(x) -> int:
    tensors = [x] if isinstance(x, torch.Tensor) else list(x)
    return sum(t.numel() * t.element_size() for t in tensors)
