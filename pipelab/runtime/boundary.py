"""What crosses a stage boundary when it is not one float tensor: one message all the same.

The toy GPT's stages hand each other one float32 activation (and get its gradient back), sent
as is. A custom model's layer may return a tuple of tensors, or integer tensors (token ids
carried along), which carry no gradient. Rather than one message per tensor, every tensor of
the output is laid end to end as bytes in one uint8 message, and the receiver cuts it back
into tensors of the shapes and dtypes measured in the parent (`Boundary.of`, from one run of
the stack). The gradient going back holds the floating-point tensors only, zeros where the
stage received none. A single float tensor needs none of this (`Boundary.plain`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Leaf = tuple[tuple[int, ...], torch.dtype]
# A boundary with no floating-point tensor still gets a gradient message (the plan sends one
# for every backward): a few zero bytes.
EMPTY_GRADIENT = 4


@dataclass(frozen=True)
class Boundary:
    leaves: tuple[Leaf, ...]
    nested: bool                       # a tuple of tensors (even of one), not a tensor

    @classmethod
    def of(cls, value, where: str) -> "Boundary":
        """The boundary that carries `value` (a tensor or a tuple of tensors); ValueError
        naming `where` otherwise."""
        tensors = [value] if isinstance(value, torch.Tensor) else value
        if not isinstance(tensors, (list, tuple)) or not tensors or \
                not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ValueError(f"{where} returned a {type(value).__name__}; what crosses a stage "
                             f"boundary must be a tensor or a tuple of tensors")
        return cls(tuple((tuple(t.shape), t.dtype) for t in tensors),
                   not isinstance(value, torch.Tensor))

    @property
    def plain(self) -> bool:
        """One floating-point tensor: sent as it is, like the toy GPT's activations."""
        return not self.nested and self.leaves[0][1].is_floating_point

    def _floats(self) -> list[int]:
        return [i for i, (_s, dtype) in enumerate(self.leaves) if dtype.is_floating_point]

    def _bytes(self, which) -> int:
        return sum(_numel(self.leaves[i][0]) * _itemsize(self.leaves[i][1]) for i in which)

    # --- the messages' shapes -----------------------------------------------------------------------
    def message(self) -> Leaf:
        """(shape, dtype) of the forward's message."""
        if self.plain:
            return self.leaves[0]
        return (self._bytes(range(len(self.leaves))),), torch.uint8

    def gradient(self) -> Leaf:
        """(shape, dtype) of the backward's message (the floating-point tensors' gradients)."""
        if self.plain:
            return self.leaves[0]
        return (self._bytes(self._floats()) or EMPTY_GRADIENT,), torch.uint8

    # --- packing and unpacking ----------------------------------------------------------------------
    def pack(self, value) -> torch.Tensor:
        """The forward's message for `value` (detached)."""
        if self.plain:
            return value.detach()
        return _concat([t.detach() for t in value] if self.nested else [value.detach()])

    def unpack(self, buffer: torch.Tensor):
        """The received message as the next stage's input: its floating-point tensors leaves
        that require a gradient, so the stage's backward yields one for each."""
        if self.plain:
            return buffer.requires_grad_()
        tensors = _cut(buffer, self.leaves, range(len(self.leaves)))
        for t in tensors:
            if t.dtype.is_floating_point:
                t.requires_grad_()
        return tuple(tensors) if self.nested else tensors[0]

    def pack_gradient(self, value) -> torch.Tensor:
        """The backward's message: the gradients of the stage input `value`'s float tensors."""
        if self.plain:
            return value.grad
        tensors = list(value) if self.nested else [value]
        grads = [tensors[i].grad if tensors[i].grad is not None else torch.zeros_like(tensors[i])
                 for i in self._floats()]
        return _concat(grads) if grads else torch.zeros(EMPTY_GRADIENT, dtype=torch.uint8)

    def backward_pairs(self, output, message: torch.Tensor) -> tuple[list, list]:
        """(tensors, gradients) for autograd.backward: the stage output's floating-point tensors
        that require a gradient, each with its part of the received message."""
        if self.plain:
            return [output], [message]
        tensors = list(output) if self.nested else [output]
        floats = self._floats()
        grads = _cut(message, self.leaves, floats)
        pairs = [(tensors[i], g) for i, g in zip(floats, grads) if tensors[i].requires_grad]
        return [t for t, _g in pairs], [g for _t, g in pairs]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _concat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _cut(buffer: torch.Tensor, leaves, which) -> list[torch.Tensor]:
    """The tensors `which` of `leaves`, laid end to end in `buffer`; each a copy of its own
    (aligned for its dtype, and a storage of its own, as the activation meter counts)."""
    out, offset = [], 0
    for i in which:
        shape, dtype = leaves[i]
        size = _numel(shape) * _itemsize(dtype)
        out.append(buffer[offset:offset + size].clone().view(dtype).reshape(shape))
        offset += size
    return out
