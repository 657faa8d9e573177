"""A real weight-gradient pass: `I` computes input gradients now, `W` the weight GEMMs later.

A Linear layer y = x·Wᵀ + b has three gradients: dx = dy·W (needed at once by the stage
below), dW = dyᵀ·x and db = Σ dy (needed only by the optimizer). The zero-bubble paper (Qi et
al., arXiv 2401.10241) splits them: during `I` each Linear computes dx and puts (x, dy) aside in
a `WeightGradStore`, keyed by (stage, microbatch); `W` later runs exactly those GEMMs. So
I + W costs what B costs, and `I` can free the rest of the autograd graph.

    store = WeightGradStore(meter)
    with store.deferring(stage, mb):       # I: backward as usual, weight GEMMs set aside
        torch.autograd.backward(out, grad)
    store.flush(stage, mb)                 # W: dW = dyᵀ·x, db = Σ dy, added into .grad

Outside `deferring`, `Linear` computes all three gradients in its backward, with the same
arithmetic as torch's own nn.Linear (bit-equal), so single-process training and a full `B` are
unchanged. LayerNorm and embedding parameters get their gradients during `I`: they cost
O(tokens·d) against the GEMMs' O(tokens·d²), and deferring them would mean storing their
inputs too. What the store holds is activation memory: it is counted by the activation meter
while held and released when `W` has run. Measured on the toy model it is most of a stage's
activations (each block keeps x and dy of its four Linears, 16 values of width d_model per
token): `I` frees only ~6-9%, the attention probabilities (the LayerNorm and GELU inputs and
q, k, v it frees too are replaced byte for byte by the dy it keeps), and `W` the rest; the
zero-bubble paper's count agrees (a layer holds 34·bsh + 5·as²b after F, 32·bsh for W).

One difference from nn.Linear: a custom Function cannot tell which gradients the engine will
use, so `torch.autograd.grad(y, [x])` through it still computes dW and drops it (nn.Linear's
addmm skips it). Pipelab's handlers use `backward`, where every gradient is wanted.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

# The deferral in force, if any: (store, key, entries). A global rather than a thread-local:
# autograd may run a backward on a thread of its own, and one rank runs one backward at a time.
_active: tuple["WeightGradStore", tuple[int, int], list] | None = None


class _LinearFunction(torch.autograd.Function):
    """x·Wᵀ + b whose backward defers dW and db to the active store, if there is one."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # The same saved tensors as torch's linear (x and W, not b): the meter counts the same.
        ctx.save_for_backward(x, weight)
        ctx.params = (weight, bias)          # the Parameters themselves, to accumulate into
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        weight_param, bias_param = ctx.params
        need_x, need_w, need_b = ctx.needs_input_grad
        dy2 = dy.reshape(-1, dy.shape[-1])
        # The products torch's addmm/mm backward computes for x·Wᵀ, in the same order.
        dx = dy2.mm(weight).view(x.shape) if need_x else None
        if not (need_w or need_b):
            return dx, None, None
        if _active is not None:
            store, _key, entries = _active
            store._stash(entries, weight_param if need_w else None,
                         bias_param if need_b else None, x, dy)
            return dx, None, None
        dw, db = _weight_grads(x, dy, need_w, need_b)
        return dx, dw, db


def _weight_grads(x: torch.Tensor, dy: torch.Tensor, need_w: bool = True, need_b: bool = True):
    """dW = dyᵀ·x and db = Σ dy over every row (all leading dimensions folded into one)."""
    dy2 = dy.reshape(-1, dy.shape[-1])
    dw = dy2.t().mm(x.reshape(-1, x.shape[-1])) if need_w else None
    db = dy2.sum(0) if need_b else None
    return dw, db


class Linear(nn.Linear):
    """nn.Linear (same parameters, names and initialisation) whose weight gradient can wait.

    Under `WeightGradStore.deferring(stage, mb)` its backward computes only the input gradient
    and leaves (x, dy) in the store; otherwise it behaves exactly like nn.Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():          # no graph: skip the Python autograd Function
            return F.linear(x, self.weight, self.bias)
        return _LinearFunction.apply(x, self.weight, self.bias)


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    # What autograd's AccumulateGrad does: take the first gradient, add later ones in place.
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class WeightGradStore:
    """The weight GEMMs each (stage, microbatch) still owes, with the tensors they need.

    `meter` (an ActivationMeter, or None) counts the stored x and dy as live activations from
    the moment `I` stores them until `flush` (the `W`) has used them."""

    def __init__(self, meter=None):
        self.meter = meter
        self._pending: dict[tuple[int, int], list] = {}   # key -> [(weight, bias, x, dy)]
        self._flushed: set[tuple[int, int]] = set()

    @contextmanager
    def deferring(self, stage: int, microbatch: int):
        """Inside: every Linear backward stores its weight work under (stage, microbatch)."""
        global _active
        key = (stage, microbatch)
        if _active is not None:
            raise RuntimeError(f"cannot defer weight gradients of stage {stage}, microbatch "
                               f"{microbatch}: those of {_active[1]} are being deferred already")
        if key in self._pending or key in self._flushed:
            raise RuntimeError(f"the input-gradient pass (I) of stage {stage}, microbatch "
                               f"{microbatch} ran twice in one step")
        entries = self._pending[key] = []         # present even if the stage has no Linear
        _active = (self, key, entries)
        try:
            yield
        finally:
            _active = None

    def _stash(self, entries: list, weight, bias, x: torch.Tensor, dy: torch.Tensor) -> None:
        entries.append((weight, bias, x, dy))
        if self.meter is not None:
            self.meter.hold(x)
            self.meter.hold(dy)

    def flush(self, stage: int, microbatch: int) -> None:
        """The `W` of (stage, microbatch): dW = dyᵀ·x and db = Σ dy into `.grad`, then forget."""
        for _ in self.flush_steps(stage, microbatch):
            pass

    def flush_steps(self, stage: int, microbatch: int):
        """`flush` one Linear at a time: a generator that yields after each layer's GEMMs (so
        other work can be braided in between)."""
        key = (stage, microbatch)
        if key not in self._pending:
            if key in self._flushed:
                raise RuntimeError(f"the weight-gradient pass (W) of stage {stage}, microbatch "
                                   f"{microbatch} ran twice in one step")
            raise RuntimeError(f"the weight-gradient pass (W) of stage {stage}, microbatch "
                               f"{microbatch} ran before its input-gradient pass (I): nothing "
                               f"is stored for it")
        entries = self._pending.pop(key)
        self._flushed.add(key)
        for weight, bias, x, dy in entries:
            with torch.no_grad():        # left before each yield: grad mode is the caller's too
                dw, db = _weight_grads(x, dy, weight is not None, bias is not None)
                if weight is not None:
                    _accumulate(weight, dw)
                if bias is not None:
                    _accumulate(bias, db)
            if self.meter is not None:
                self.meter.drop(x)
                self.meter.drop(dy)
            yield
        entries.clear()

    def pending(self) -> list[tuple[int, int]]:
        """The (stage, microbatch) keys whose W has not run yet."""
        return sorted(self._pending)

    def nbytes(self, stage: int | None = None, microbatch: int | None = None) -> int:
        """Bytes of x and dy held (each storage once), for one key or all of them."""
        seen: dict[int, int] = {}
        for (s, mb), entries in self._pending.items():
            if (stage is None or s == stage) and (microbatch is None or mb == microbatch):
                for _w, _b, x, dy in entries:
                    for t in (x, dy):
                        storage = t.untyped_storage()
                        seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())
