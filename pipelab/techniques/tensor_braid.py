"""Braided steps: one microbatch's tensor-parallel all-reduce runs while another one computes.

Inside a compound step (STP's F+F, F+B, F+I, F+W) the executor runs the parts' *braided*
handlers side by side: each is a generator that yields where it would otherwise wait, and the
executor lets the other part compute meanwhile (runtime/handlers.py, HandlerSpec.braid).

    F   a block's attention, up to its row-parallel output: launch the all-reduce of the partial
        sums (`async_op=True`), yield; when resumed, wait for it, add the residual; the same
        for the MLP. So a braided forward has its all-reduces in flight while the other part
        computes (the paper's F.attn(a) | B.mlp(b) | … braid).
    B, I the plain handler's backward, run on a thread of its own in strict turns with the
        executor (`in_turns`): where f's backward needs the input gradient summed, it launches
        the all-reduce (`async_op=True`) and hands the turn back, so the other part computes
        while the sum travels (B.mlp(b) | F.attn(a) | B.attn(b) | …); resumed, it waits and
        goes on. Autograd cannot yield mid-graph, hence the thread; the turns are strict, so
        only one of the two ever runs and they share the rank's state as one thread would.
    W   the deferred weight GEMMs one Linear at a time, yielding in between: a forward's
        all-reduce can run under them.

The arithmetic is the unbraided handlers' (the same sums, each added once), so the gradients
are bit-identical.
"""
from __future__ import annotations

import threading

import torch

from ..runtime.handlers import (backward, forward_input, forward_output, input_backward,
                                register_braid)
from .tensor import TensorParallelBlock, pausing


class _Summed(torch.autograd.Function):
    """Megatron's g with the sum done outside: forward, the already-summed tensor; backward,
    the gradient goes to the partial sums unchanged (as g's identity backward)."""

    @staticmethod
    def forward(ctx, partial, total):
        return total.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@register_braid("F")
def forward_braided(state, a, inputs: dict):
    inp = x = forward_input(state, a, inputs)
    for layer in state.module(a.stage, a.microbatch):
        if not isinstance(layer, TensorParallelBlock):
            with state.saving(a.stage, a.microbatch):
                x = layer(x)
            continue
        for sublayer in (layer.attention_partial, layer.mlp_partial):
            # (never held across a yield: the hooks are global)
            with state.saving(a.stage, a.microbatch):
                partial = sublayer(x)
            total = partial.detach().clone()
            pending = layer.proj.tp.all_reduce(total, "forward, async", async_op=True)
            yield                             # the other part computes while the sum travels
            pending.wait()
            with state.saving(a.stage, a.microbatch):
                x = x + _Summed.apply(partial, total)
    return forward_output(state, a, inp, x)


@register_braid("W")
def weight_braided(state, a, inputs: dict):
    yield from state.weight_grads.flush_steps(a.stage, a.microbatch)
    return None


@register_braid("B")
def backward_braided(state, a, inputs: dict):
    return (yield from in_turns(lambda: backward(state, a, inputs)))


@register_braid("I")
def input_backward_braided(state, a, inputs: dict):
    return (yield from in_turns(lambda: input_backward(state, a, inputs)))


def in_turns(work):
    """Run `work()` as a generator: on a thread of its own, which stops wherever the work
    pauses (tensor.pausing) and then this generator yields; next() resumes it. Exactly one of
    the caller and the work runs at any time. Returns what `work` returns, raises what it raises."""
    turns = _idle.pop() if _idle else _Turns()
    turns.work = work
    while True:
        turns.go.release()
        turns.back.acquire()
        if "done" in turns.outcome:
            break
        yield
    _idle.append(turns)        # (one abandoned mid-way stays paused: a daemon, never reused)
    if "error" in turns.outcome:
        raise turns.outcome["error"]
    return turns.outcome["value"]


class _Turns:
    """A thread that runs work items in strict turns with its caller. Kept for the next item:
    starting a thread on a loaded machine waits for a scheduler slice (measured: STP's step
    took 2-3x longer with a fresh thread per backward), waking a sleeping one does not."""

    def __init__(self):
        self.go, self.back = threading.Semaphore(0), threading.Semaphore(0)
        self.work, self.outcome = None, {}
        threading.Thread(target=self._serve, name="braid", daemon=True).start()

    def pause(self) -> None:
        self.back.release()
        self.go.acquire()

    def _serve(self) -> None:
        while True:
            self.go.acquire()
            self.outcome = {}
            try:
                with pausing(self.pause):
                    self.outcome["value"] = self.work()
            except BaseException as error:       # handed to the caller's thread by in_turns
                self.outcome["error"] = error
            self.work = None
            self.outcome["done"] = True
            self.back.release()


_idle: list[_Turns] = []       # this process's threads with no work (one per braided backward at once)
