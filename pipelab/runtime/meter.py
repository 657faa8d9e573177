"""Live activation bytes, counted the way autograd holds them: tensors saved for backward.

A `saved_tensors_hooks` pack hook sees every tensor a forward saves for its backward. We count
each storage once (q, k and v are views of one qkv output), skip the parameters' storages
(weights are not activations), and subtract when autograd lets go of the saved tensor, which
happens as the backward that needs it runs. This reproduces the textbook curves (GPipe holds m
microbatches of activations, 1F1B at most p − rank).
"""
from __future__ import annotations

from typing import Iterable

import torch


class _Saved:
    """What autograd stores instead of the tensor; its death releases the bytes."""
    __slots__ = ("tensor", "meter", "key")

    def __init__(self, meter: "ActivationMeter", tensor: torch.Tensor, key: int, nbytes: int):
        self.tensor, self.meter, self.key = tensor, meter, key
        meter._acquire(key, nbytes)

    def __del__(self) -> None:
        self.meter._release(self.key)


class ActivationMeter:
    """Use `with meter.saving():` around a forward; read `live` (bytes now) and `peak`."""

    def __init__(self, parameters: Iterable[torch.Tensor] = ()):
        self._exclude = {p.untyped_storage().data_ptr() for p in parameters}
        self._refs: dict[int, list[int]] = {}        # storage address -> [saved count, bytes]
        self.live = 0
        self.peak = 0
        self.sending = 0             # bytes of posted sends not yet known to be delivered
        self.sending_peak = 0

    def _acquire(self, key: int, nbytes: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            self._refs[key] = [1, nbytes]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            entry[0] += 1

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._refs[key]
            self.live -= entry[1]

    def _key(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        """(storage address, bytes) of an activation; None for a parameter or an empty one."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._exclude or storage.nbytes() == 0:
            return None
        return key, storage.nbytes()

    def hold(self, tensor: torch.Tensor) -> None:
        """Count `tensor` as live until `drop(tensor)`: for activations kept outside autograd,
        such as the inputs and output gradients the weight-gradient store keeps from I to W.
        A storage already counted (saved by autograd too) is not counted twice."""
        key = self._key(tensor)
        if key is not None:
            self._acquire(*key)

    def drop(self, tensor: torch.Tensor) -> None:
        """Undo one `hold(tensor)`; the bytes go when nothing else holds the storage."""
        key = self._key(tensor)
        if key is not None:
            self._release(key[0])

    def _pack(self, tensor: torch.Tensor):
        key = self._key(tensor)
        if key is None:
            return tensor
        # Keep a detached alias: holding the tensor itself would make a reference cycle
        # (output -> grad_fn -> saved -> output) that leaks when no backward ever runs.
        return _Saved(self, tensor.detach(), *key)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def saving(self):
        """Context manager: tensors saved for backward inside it are counted."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def hold_send(self, nbytes: int) -> None:
        """A send buffer, alive until its send is waited on (counted apart from activations)."""
        self.sending += nbytes
        self.sending_peak = max(self.sending_peak, self.sending)

    def sends_done(self) -> None:
        self.sending = 0

    def reset_peak(self) -> None:
        self.peak = self.live
