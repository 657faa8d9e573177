"""One rank's part of a pipeline run: its actions in order, with the messages around them.

The executor knows nothing about particular schedules or action kinds. For each `Step` of the
communication plan (derived from the schedule, never written by hand) it receives what the
step waits for, runs the action's handler, and posts the sends. It records, per action, the
wall-clock span (receive wait excluded, kept separately), thread CPU time and live activation
bytes after the action. The same function runs in a LocalCluster worker and under torchrun.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ..data import get_batch
from ..model import ModelConfig, ToyGPT, loss_fn
from ..schedules import comm_plan
from ..schedules.comm import consumers
from . import p2p
from .board import DONE, OPTIM, RECV, RUN, SENDS, SETUP, SYNC, NoBoard
from .handlers import HANDLERS
from .meter import ActivationMeter
from .spec import RunSpec
from .stage import RankStages, StepState


def run_rank(spec: RunSpec, rank: int, board=None, notify=None) -> dict:
    """Run every training step of `spec` as `rank` (torch.distributed must be initialised).

    Returns a plain, picklable report; `notify(step, loss)` is called by the rank holding the
    last stage after each step (the parent's progress bar).
    """
    board = board or NoBoard()
    board.set(rank, 0, 0, SETUP)
    sched = spec.schedule
    plan = comm_plan(sched)[rank]
    stages = RankStages(spec.cfg, spec.bounds, sched.stages_of(rank))
    params = stages.parameters()
    optimizer = torch.optim.AdamW(params, lr=spec.lr) if spec.steps > 1 else None
    # Outputs consumed by another stage on this same rank are handed over in memory.
    keep_local = [any(sched.rank_of(c.stage) == rank for c in consumers(sched, step.action))
                  for step in plan]
    holds_loss = sched.rank_of(sched.stages - 1) == rank
    generator = torch.Generator().manual_seed(spec.seed)   # the same batches on every rank
    report = {"rank": rank, "pid": os.getpid(), "steps": [], "grads": None}
    for k in range(spec.steps):
        inputs, targets = get_batch(spec.batch_size, spec.cfg.seq_len, generator=generator)
        stages.zero_grad()
        meter = ActivationMeter(params)
        state = StepState(sched, stages, inputs, targets, meter)
        board.set(rank, k, 0, SYNC)
        dist.barrier()                 # every rank starts the step together: one time origin
        report["steps"].append(_run_step(spec, rank, k, plan, keep_local, state, board))
        if k == 0 and spec.check:
            report["grads"] = stages.gradients()
        if notify is not None and holds_loss:
            notify(k, sum(state.losses.values()) / state.m)
        # The last step's update is skipped: its weights are never used again (every run
        # rebuilds its stages from the config), and its gradients are what gets reported.
        if optimizer is not None and k < spec.steps - 1:
            board.set(rank, k, len(plan), OPTIM)
            optimizer.step()
    board.set(rank, spec.steps - 1, len(plan), DONE)
    return report


def warm_up() -> None:
    """A tiny forward and backward through every code path the handlers use, so the first real
    action does not pay one-time costs (the first non-scalar backward of a process takes
    ~0.3 s) and distort the first measured timeline."""
    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=1, seq_len=4)
    model = ToyGPT(cfg)
    idx = torch.zeros(1, 4, dtype=torch.long)
    meter = ActivationMeter(model.parameters())
    with meter.saving():
        hidden = model.layers[0](idx)
        inner = hidden.detach().requires_grad_()
        middle = model.layers[1](inner)
        loss = loss_fn(model.layers[2](middle.detach().requires_grad_()), idx)
    torch.autograd.backward(loss)
    grad = torch.ones_like(middle)
    torch.autograd.grad(middle, [inner], grad, retain_graph=True)
    torch.autograd.backward(middle, grad, inputs=list(model.layers[1].parameters()))
    torch.autograd.backward(hidden, torch.ones_like(hidden))


def _stall(action) -> None:
    while True:                        # test hook: a stuck action; the parent's watchdog kills us
        time.sleep(0.5)


def _run_step(spec: RunSpec, rank: int, k: int, plan, keep_local, state: StepState, board) -> dict:
    shape = spec.boundary_shape()
    stall, fail, drop = (spec.inject.get(key) for key in ("stall", "raise", "drop"))
    clock, cpu_clock = time.perf_counter, time.thread_time
    actions, recvs, pending = [], [], []
    begin = clock()
    memory = [(begin, state.meter.live)]
    posted = [p2p.post_recv(t, shape) for t in plan[0].recv] if plan else []
    for i, step in enumerate(plan):
        a = step.action
        waited_from = clock()
        for j, (transfer, (handle, buffer)) in enumerate(zip(step.recv, posted)):
            board.set(rank, k, i, RECV, j)
            t = clock()
            handle.wait()
            state.received[transfer.producer] = buffer
            recvs.append((transfer.producer, a, transfer.src, t, clock()))
        # Post the next step's receives before computing: never blocks, hides the transfer.
        posted = [p2p.post_recv(t, shape) for t in plan[i + 1].recv] if i + 1 < len(plan) else []
        board.set(rank, k, i, RUN)
        cpu0, start = cpu_clock(), clock()
        if a == stall:
            _stall(a)
        if a == fail:
            raise RuntimeError(f"injected failure in {a} (the _inject test hook)")
        out = HANDLERS[a.kind](state, a)
        end, cpu = clock(), cpu_clock() - cpu0
        if out is not None:
            if keep_local[i]:
                state.local[a] = out
            if a != drop:
                for transfer in step.send:
                    p2p.send(transfer, out, pending)
        actions.append((i, a, waited_from, start, end, cpu, state.meter.live))
        memory.append((end, state.meter.live))
    board.set(rank, k, len(plan), SENDS)
    p2p.wait_all(pending)
    return {"begin": begin, "actions": actions, "recvs": recvs, "memory": memory,
            "losses": dict(state.losses), "peak": state.meter.peak}
