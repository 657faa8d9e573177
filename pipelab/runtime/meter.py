"""Live activation bytes, counted the way autograd holds them: tensors saved for backward.

A `saved_tensors_hooks` pack hook sees every tensor a forward saves for its backward. We count
each storage once (q, k and v are views of one qkv output), skip the parameters' storages
(weights are not activations), and subtract when autograd lets go of the saved tensor, which
happens as the backward that needs it runs. This reproduces the textbook curves (GPipe holds m
microbatches of activations, 1F1B at most p − rank).

The hook runs for every saved tensor (about 60 per stage and microbatch of the toy model), so
it is the runtime's largest per-action cost on small microbatches and is written for speed:
a parameter is recognised by its data address before any storage object is made (a saved
weight or its transpose starts where the parameter starts); a saved activation is kept as a
detached alias (`.data`) (holding the tensor itself would make a reference cycle output -> grad_fn ->
saved -> output that leaks when no backward ever runs), watched by a weak reference whose
callback releases its bytes, so there is no Python object of our own and no `__del__` per
tensor; counts and sizes are plain ints in dicts; unpacking is the identity.

Sampled (the default in a run): even so, hooking every forward cost 13% of a small step's
CPU (1F1B, d_model 64, m=8, 2 ranks). So a run's meter hooks only the first forward of each
stage in a step (per step, not per run: a step's figures then never lean on an earlier step's,
and m = 8 already leaves 1/8 of the hooks) and *records* what that microbatch's actions do to
the live bytes: per (stage, the kinds run so far), the net change and the rise above the
starting level inside the action. Every other microbatch of the stage runs without hooks
(`saving` hooks nothing, `hold`/`drop` do nothing) and its actions are counted from the record:
the executor brackets each part with `begin(part)` / `end()`. Measured there: 2% above no meter
at all. That is exact whenever the microbatches of a stage save the same tensors; sampling.py
decides per run where that is promised and hooks every forward elsewhere (a custom model, MoE,
recomputation, offload, tensor parallelism, …). The full meter stays available: `sample=None`
here, or `cluster.run(..., _meter="full")` / `RunSpec.meter = "full"` for a run (the exactness
test, tests/test_meter_sampled.py, and `benchmarks/vs_torch.py --profile` compare the two);
`RunResult.meter` says which each process used.
"""
from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Iterable

import torch


def _identity(tensor):
    return tensor


_NO_HOOKS = nullcontext()             # reusable: a replayed forward saves uncounted


class ActivationMeter:
    """Use `with meter.saving():` around a forward; read `live` (bytes now) and `peak`."""

    def __init__(self, parameters: Iterable[torch.Tensor] = (), sample: dict | None = None):
        """`sample`: {part: (record?, key)}, what to do at each part of a step (sampling.py:
        record a hooked part's effect under key, or replay the record unhooked); None hooks
        every forward."""
        parameters = list(parameters)
        self._exclude = {p.untyped_storage().data_ptr() for p in parameters}
        self._exclude_data = {p.data_ptr() for p in parameters} | self._exclude
        self._count: dict[int, int] = {}     # storage address -> saved tensors using it
        self._bytes: dict[int, int] = {}     # storage address -> its size
        # id(watcher) -> (watcher, storage address). Keyed by id: a weak reference hashes as its
        # tensor does, and Tensor.__hash__ is a Python function (a call per save and release).
        self._watchers: dict[int, tuple[weakref.ref, int]] = {}
        self._on_free = self._release        # one bound method shared by every watcher
        self.live = 0
        self.peak = 0
        self.sending = 0             # bytes of posted sends not yet known to be delivered
        self.sending_peak = 0
        self.offloaded = 0           # bytes of saved activations held off the device (offload.py)
        self.offloaded_peak = 0
        self._sample = sample
        # key -> (net change of live bytes, rise above the start inside the action)
        self._records: dict[tuple, tuple[int, int]] = {}
        self._recording: tuple | None = None
        self._replaying: tuple[int, int] | None = None    # the record being replayed
        self._start = self._outer_peak = 0

    def _acquire(self, tensor: torch.Tensor) -> int | None:
        """Count one more holder of `tensor`'s storage; its address, or None when it is not an
        activation (a parameter, a view inside one, an empty storage)."""
        if tensor.data_ptr() in self._exclude_data:
            return None                      # a parameter, or a view of one at its start
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        count = self._count.get(key)
        if count is None:
            if key in self._exclude:
                return None                  # a view elsewhere inside a parameter
            nbytes = storage.nbytes()
            if not nbytes:
                return None
            self._count[key] = 1
            self._bytes[key] = nbytes
            self.live = live = self.live + nbytes
            if live > self.peak:
                self.peak = live
        else:
            self._count[key] = count + 1
        return key

    def _pack(self, tensor: torch.Tensor):
        key = self._acquire(tensor)
        if key is None:
            return tensor
        # `.data`: the same storage, shape and strides with no autograd history, like
        # `detach()` but ~25% cheaper (no view tracking); autograd only reads it back.
        packed = tensor.data
        watcher = weakref.ref(packed, self._on_free)
        self._watchers[id(watcher)] = (watcher, key)
        return packed

    def count_saved(self, tensor: torch.Tensor):
        """Count `tensor` as saved for backward until the returned alias is let go: what a
        recomputation materialises for a graph the forward built (recompute.py)."""
        return self._pack(tensor)

    def _release(self, ref: weakref.ref) -> None:
        self._let_go(self._watchers.pop(id(ref))[1])

    def _let_go(self, key: int) -> None:
        count = self._count[key] - 1
        if count:
            self._count[key] = count
        else:
            del self._count[key]
            self.live -= self._bytes.pop(key)

    def hold(self, tensor: torch.Tensor) -> None:
        """Count `tensor` as live until `drop(tensor)`: for activations kept outside autograd,
        such as the inputs and output gradients the weight-gradient store keeps from I to W.
        A storage already counted (saved by autograd too) is not counted twice."""
        if self._replaying is None:          # else the record counts it
            self._acquire(tensor)

    def drop(self, tensor: torch.Tensor) -> None:
        """Undo one `hold(tensor)`; the bytes go when nothing else holds the storage."""
        if self._replaying is not None or tensor.data_ptr() in self._exclude_data:
            return
        key = tensor.untyped_storage().data_ptr()
        if key in self._count:
            self._let_go(key)

    def add_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        """Weights made during the run (a new weight version): parameters, never activations."""
        for p in parameters:
            self._exclude.add(p.untyped_storage().data_ptr())
            self._exclude_data.add(p.data_ptr())

    def remove_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        """Weights freed during the run: their memory may come back as activations."""
        for p in parameters:
            self._exclude.discard(p.untyped_storage().data_ptr())
            self._exclude_data.discard(p.data_ptr())

    def hold_send(self, nbytes: int) -> None:
        """A send buffer, alive until its send is waited on (counted apart from activations)."""
        self.sending += nbytes
        self.sending_peak = max(self.sending_peak, self.sending)

    def sends_done(self) -> None:
        self.sending = 0

    def saving(self, keep: list | None = None):
        """Context manager: tensors saved for backward inside it are counted. With `keep` (a
        list), each counted one is saved in a box (a one-item list) appended to it, which an
        offload may point elsewhere before the backward reads it (offload.py). In a replayed
        action (see `begin`) it hooks nothing."""
        if self._replaying is not None:
            return _NO_HOOKS
        if keep is None:
            return torch.autograd.graph.saved_tensors_hooks(self._pack, _identity)

        def pack(tensor):
            packed = self._pack(tensor)
            if packed is tensor:         # a parameter: stays where it is
                return tensor
            box = [packed]
            keep.append(box)
            return box

        def unpack(packed):
            return packed[0] if type(packed) is list else packed
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def reset_peak(self) -> None:
        self.peak = self.live

    # --- sampling: one hooked microbatch per stage, the others counted from its record -------
    def begin(self, part) -> None:
        """A part of a step (an Action) starts: counted live and recorded, replayed from a
        record with its forward's hooks off, or (not in the sample) simply counted live."""
        todo = self._sample.get(part) if self._sample is not None else None
        if todo is None:
            return
        record, key = todo
        if record:
            self._recording = key
            self._outer_peak, self._start = self.peak, self.live
            self.peak = self.live                    # the part's own peak, from its start
        else:
            self._replaying = self._records[key]

    def end(self) -> None:
        """The part `begin` saw has finished: keep its record, or apply the one replayed."""
        if self._recording is not None:
            self._records[self._recording] = (self.live - self._start, self.peak - self._start)
            self._recording = None
            if self._outer_peak > self.peak:
                self.peak = self._outer_peak
        elif self._replaying is not None:
            net, rise = self._replaying
            self._replaying = None
            if self.live + rise > self.peak:
                self.peak = self.live + rise
            self.live += net
