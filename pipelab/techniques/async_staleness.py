"""What an asynchronous run should have computed, in one process.

Asynchronous schedules cannot match the unsplit model's gradient at the *initial* weights (the
weights change mid-run), so correctness is defined per update:

- **stashing**: the gradient each `U` applied equals the unsplit model's gradient of the
  microbatches it covers, where each stage holds the version that microbatch's forward used —
  the versions the run itself made (`emulate(spec, live=...)`);
- **the update rule**: the whole run equals a one-process emulation that starts from the
  initial weights and applies the schedule's updates in a feasible order with the same rule,
  W_new = W_newest − lr · mean gradient (`emulate`). For 2BW this is W(t+1) = W(t) − ν∇f(W(t−1)).

Both walk the schedule's updates in its dataflow order and compute each microbatch's gradient
on a full ToyGPT loaded with that microbatch's versions, stage by stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.data import get_batch, split_microbatches
from ..model.gpt import ToyGPT, loss_fn
from ..schedules.updates import UPDATE, covered, version_plan
from ..support.threads import one_thread


@dataclass
class Emulation:
    """Per update (its text, e.g. "0U3"): the mean gradient it applies and the version it makes;
    per microbatch: its loss at its versions."""
    grads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    weights: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)


def sgd_step(weight: torch.Tensor, grad: torch.Tensor, lr: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """W − lr·g, the one update rule of asynchronous runs: the runtime's updates
    (async_versions.py) and this emulation both apply it."""
    return torch.add(weight, grad, alpha=-lr, out=out)


def _stage_of(name: str, bounds) -> int:
    layer = int(name.split(".")[1])
    return next(s for s, (a, b) in enumerate(bounds) if a <= layer < b)


def emulate(spec, live: dict[str, dict] | None = None) -> Emulation:
    """Run `spec`'s schedule in one process with the runtime's update rule.

    `live`: the run's own updates ({"0U3": {"weights": …}}). Given, every version a microbatch
    reads is the one the run made (a check of stashing, update by update); else every version
    is the emulation's own, from the initial weights (a check of the whole run)."""
    sched, cfg, lr = spec.schedule, spec.cfg, spec.lr
    plan = version_plan(sched)
    model = ToyGPT(cfg)
    stage_of = {name: _stage_of(name, spec.bounds) for name, _p in model.named_parameters()}
    versions = {s: {None: {n: p.detach().clone() for n, p in model.named_parameters()
                           if stage_of[n] == s}} for s in range(sched.stages)}
    newest = {s: None for s in range(sched.stages)}
    inputs, targets = get_batch(spec.batch_size, cfg.seq_len,
                                generator=torch.Generator().manual_seed(spec.seed))
    micro = split_microbatches(inputs, targets, sched.microbatches)
    grads: dict[int, dict[str, torch.Tensor]] = {}
    out = Emulation()

    def gradient(mb: int) -> dict[str, torch.Tensor]:
        if mb not in grads:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    s = stage_of[name]
                    p.copy_(versions[s][plan.source[(s, mb)]][name])
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(micro[mb][0]), micro[mb][1])
            out.losses[mb] = loss.item()
            (loss / sched.microbatches).backward()     # scaled as the pipeline's F scales it
            grads[mb] = {n: p.grad.clone() for n, p in model.named_parameters()}
        return grads[mb]

    for _ranks, item, _deps in sched.execution_order():
        for a in item.parts:
            if a.kind != UPDATE:
                continue
            mbs = covered(sched, a)
            names = list(versions[a.stage][None])
            total = {n: sum((gradient(mb)[n] for mb in mbs[1:]), gradient(mbs[0])[n].clone())
                     for n in names}
            mean = {n: g * (sched.microbatches / len(mbs)) for n, g in total.items()}
            base = versions[a.stage][newest[a.stage]]
            made = {n: sgd_step(base[n], mean[n], lr) for n in names}
            out.grads[str(a)], out.weights[str(a)] = mean, made
            versions[a.stage][a] = live[str(a)]["weights"] if live is not None else made
            newest[a.stage] = a
    return out


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over tensors of max|got − want| / max|want|."""
    return max(((got[n] - w).abs().max() / max(w.abs().max().item(), 1e-12)).item()
               for n, w in want.items())


@dataclass
class AsyncCheck:
    """An asynchronous run against its definitions (see the module docstring)."""
    grad_error: float                 # worst update: its gradient vs the unsplit model's at stash
    grad_errors: dict[str, float]     # per update
    weight_error: float               # last versions vs the one-process emulation from scratch
    loss_error: float                 # per-microbatch losses vs the unsplit model's at stash
    reference_losses: dict[int, float]


def check_run(spec, updates: dict[str, dict], losses: dict[int, float]) -> AsyncCheck:
    """Compare a run's updates and losses with both emulations."""
    with one_thread():                # tiny products: a second thread only waits (threads.py)
        stashed, fresh = emulate(spec, live=updates), emulate(spec)
    errors = {u: relative_error(rec["grad"], stashed.grads[u]) for u, rec in updates.items()}
    weight = max(relative_error(rec["weights"], fresh.weights[u]) for u, rec in updates.items())
    loss = max(abs(losses[mb] - ref) / max(abs(ref), 1e-12) for mb, ref in stashed.losses.items())
    return AsyncCheck(max(errors.values()), errors, weight, loss, stashed.losses)
