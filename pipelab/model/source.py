"""What a pipeline run needs from a model, whoever wrote it: the one interface of the runtime.

The toy GPT (`gpt.GPTSource`, from a `ModelConfig`) and a user's own stack (`custom.CustomModel`)
both implement `ModelSource`; the runtime builds stages, draws batches, computes the loss and
checks the run against the unsplit model only through it. A model is a flat list of layers (the
unit a partition cuts), each built with the same weights on whichever process builds it.

A batch is `(inputs, targets)`; each is a tensor or a tuple of tensors whose first dimension is
the rows, so it splits into microbatches and data-parallel shares with `split_rows` / `take_rows`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

import torch
from torch import nn


class ModelSource(ABC):
    """A model the runtime can split into stages (see the module docstring)."""

    #: What the built-in techniques read of a model's inside: mixture-of-experts layers (expert
    #: parallelism) and tables shared by the first and last layer. False unless a model says so.
    moe: bool = False
    tie_embeddings: bool = False

    @property
    @abstractmethod
    def total_layers(self) -> int:
        """How many layers the flat list has."""

    @abstractmethod
    def build(self, start: int, stop: int) -> nn.Sequential:
        """Layers [start, stop) with the weights they have in the whole model, ready for the
        pipeline's passes (a Linear's weight gradient may wait for a W pass)."""

    @abstractmethod
    def loss(self, output, targets) -> torch.Tensor:
        """The scalar loss of the last layer's output: a mean over the rows, so that the
        microbatches' mean losses average to the batch's."""

    @abstractmethod
    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[object, object]]:
        """(inputs, targets) of every training step in turn, the same on every process."""

    @abstractmethod
    def reference(self, batch_size: int, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
        """Loss and gradients of the unsplit model on the first batch; a parameter is named
        `layers.{index in the flat list}.{its name inside the layer}`."""

    @abstractmethod
    def parameter_bytes(self, start: int, stop: int) -> int:
        """Bytes of the parameters of layers [start, stop)."""


# --- batches whose parts are tensors or tuples of tensors -------------------------------------------
def map_tensors(fn, value):
    """`fn` applied to a tensor, or to each tensor of a tuple or list (kept a tuple)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    return tuple(fn(t) for t in value)


def rows(value) -> int:
    """The number of rows of a batch part (every tensor's first dimension; ValueError if they
    differ or a part is not a tensor or a tuple of tensors)."""
    tensors = [value] if isinstance(value, torch.Tensor) else list(value) \
        if isinstance(value, (tuple, list)) else None
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
        raise ValueError(f"a batch part must be a tensor or a tuple of tensors with a row "
                         f"dimension first, got {_describe(value)}")
    counts = {t.shape[0] for t in tensors}
    if len(counts) != 1:
        raise ValueError(f"the tensors of a batch part must have the same number of rows "
                         f"(first dimension), got {sorted(counts)}")
    return counts.pop()


def take_rows(value, which: slice):
    """The rows `which` of a batch part."""
    return map_tensors(lambda t: t[which], value)


def split_rows(value, parts: int) -> list:
    """A batch part cut along its rows into `parts` equal contiguous pieces."""
    size = rows(value) // parts
    return [map_tensors(lambda t: t[i * size:(i + 1) * size].contiguous(), value)
            for i in range(parts)]


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"
