"""The stages one rank owns, and what a training step keeps between its actions.

Stage s is layers `bounds[s]` of the flat list, built by the model source (`build_layers` for
the toy GPT, the user's `layers` for a CustomModel), so its weights are exactly those of the
same layers in the unsplit model. Every stage input that came from
another stage is a fresh leaf tensor with `requires_grad`, which is what lets a stage's backward
hand the gradient of its input to the previous stage.
"""
from __future__ import annotations

import torch
from torch import nn

from ..model.gpt_source import model_source
from ..model.source import ModelSource, map_tensors, split_rows
from ..schedules import Action
from ..model.weight_grad import WeightGradStore
from .offload import OffloadStore
from ..schedules.kinds import OFFLOAD, OUTPUT_GRADIENT


def mark_replica_own(p: nn.Parameter) -> None:
    """Mark `p` as this data-parallel replica's own (its share of the experts), not a copy of
    a parameter every replica holds: its gradient is already the whole batch's, so it is not
    summed over the replicas (collectives.py), and each replica reports its own."""
    p.replica_own = True


def replica_own(p: nn.Parameter) -> bool:
    return getattr(p, "replica_own", False)


class RankStages:
    """The modules of the stages placed on one rank, named as in the unsplit model."""

    def __init__(self, model, bounds: list[tuple[int, int]], stages: list[int],
                 tp=None, crossing: dict | None = None):
        """`model`: a ModelConfig or a ModelSource. `crossing`: {layer: boundary.Boundary} for
        the stage boundaries that are not one float tensor (after that layer)."""
        self.bounds = bounds
        self.model: ModelSource = model_source(model)
        self.modules = {s: self.model.build(*bounds[s]) for s in stages}
        # How each stage's input and output cross to their neighbours: None is one float tensor,
        # sent as is (handlers.py); a Boundary packs tuples and integer tensors into one message.
        crossing = crossing or {}
        self.inbound = {s: crossing.get(bounds[s][0] - 1) for s in stages}
        self.outbound = {s: crossing.get(bounds[s][1] - 1) for s in stages}
        if tp is not None:         # a tensor-parallel shard: splits the blocks (in a run, the
            self.shard(tp)         # tensor technique's setup does this)
        # Spans a technique's code times while an action runs, (start, end, what): the executor
        # hands each to the part that was running (a tensor-parallel all-reduce).
        self.log: list[tuple[float, float, str]] = []
        # Row slices of the unsplit model's parameters this rank holds besides its stages
        # (vocabulary parallelism): name in ToyGPT -> (the slice, its first row, full shape).
        self.shards: dict[str, tuple[nn.Parameter, int, tuple[int, ...]]] = {}

    def shard(self, tp) -> None:
        """Replace each stage's layers by `tp`'s shard of them (`tp.shard(layers)`)."""
        self.modules = {s: tp.shard(module) for s, module in self.modules.items()}

    def parameters(self) -> list[nn.Parameter]:
        params = [p for module in self.modules.values() for p in module.parameters()]
        return params + [p for p, _, _ in self.shards.values()
                         if all(p is not q for q in params)]

    def named_parameters(self):
        """(name in ToyGPT, parameter): local layer j of stage s is `layers.{start + j}`."""
        for s, module in self.modules.items():
            yield from zip(layer_names(module, self.bounds[s][0]), module.parameters())

    def zero_grad(self) -> None:
        for module in self.modules.values():
            module.zero_grad(set_to_none=True)
        for p, _, _ in self.shards.values():
            p.grad = None

    def gradients(self, which=None) -> dict[str, torch.Tensor]:
        """Per parameter name, its gradient; a shard's is zero outside its rows, so the ranks'
        reports sum to the whole parameter's. `which(parameter)` picks some (default: all)."""
        grads = {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                 for name, p in self.named_parameters() if which is None or which(p)}
        for name, (p, first, shape) in self.shards.items():
            full = torch.zeros(shape)
            if p.grad is not None:
                full[first:first + p.shape[0]] = p.grad
            grads[name] = full
        return grads


def layer_names(module: nn.Sequential, start: int) -> list[str]:
    """The names in ToyGPT of a stage module's parameters, in order (its first layer is
    `layers.{start}`)."""
    out = []
    for name, _p in module.named_parameters():
        local, rest = name.split(".", 1)
        out.append(f"layers.{start + int(local)}.{rest}")
    return out


class StepState:
    """One training step on one rank: its microbatches and what backward still needs."""

    def __init__(self, schedule, stages: RankStages, inputs: torch.Tensor,
                 targets: torch.Tensor, meter):
        self.schedule = schedule
        self.stages = stages
        self.m = schedule.microbatches
        # Each microbatch gets its own storage, as on a real pipeline: the activation meter
        # counts storages, and views of one batch tensor would all count as the first one.
        clone = torch.Tensor.clone
        self.microbatches = [(map_tensors(clone, x), map_tensors(clone, y))
                             for x, y in zip(split_rows(inputs, self.m), split_rows(targets, self.m))]
        # Where each stage's route starts (reads tokens) and ends (computes the loss).
        before, after = schedule.links()
        self.first_stages = {s for s, b in enumerate(before) if b < 0}
        self.last_stages = {s for s, a in enumerate(after) if a < 0}
        self.last_stage = schedule.stages - 1          # the end of a one-route pipeline
        self.meter = meter
        self.saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (s, mb) -> (in, out)
        # What each I leaves for its W (the Linears' inputs and output gradients), metered.
        self.weight_grads = WeightGradStore(meter)
        self.local: dict[Action, list] = {}      # outputs read by later steps here: [tensor, readers left]
        self.losses: dict[int, float] = {}       # per microbatch, unscaled
        # Data parallelism: each microbatch loss is divided by m × replicas, so the gradients
        # summed over the replicas are the whole batch's. `dp_group` sums a stage's gradients;
        # `in_flight` holds the reductions launched but not yet waited for.
        self.replicas = 1
        self.dp_group = None
        self.in_flight: list = []
        # Weight versions (techniques/async_versions.py) when the schedule updates inside itself.
        self.versions = None
        # Activation recomputation (recompute.py): a Recomputer when a policy drops activations.
        self.recompute = None
        # Where the loss is computed: on the last stage, unless the schedule feeds that stage's
        # backward from other actions (vocabulary parallelism computes it across the ranks).
        if schedule._index is None:
            schedule.reindex()
        self.loss_on_last_stage = not any(key[0] == OUTPUT_GRADIENT for key in schedule._index)
        self.scratch: dict = {}                  # what a kind's passes leave for each other
        # Activation offload (offload.py): the (stage, microbatch) forwards whose saved tensors
        # this rank moves off the device, and where their boxes wait.
        self.offloads = None
        chosen = {(a.stage, a.microbatch) for acts in schedule.actions for item in acts
                  for a in item.parts if a.kind == OFFLOAD and a.stage in stages.modules}
        if chosen:
            self.offloads = OffloadStore(meter, chosen)

    def saving(self, stage: int, microbatch: int):
        """The meter's context for a forward of (stage, microbatch): boxed where it is offloaded."""
        keep = self.offloads.keep(stage, microbatch) if self.offloads is not None else None
        return self.meter.saving(keep)

    def forward(self, stage: int, microbatch: int, inp: torch.Tensor) -> torch.Tensor:
        """The stage's forward; under a recompute policy, keeping only what the policy keeps."""
        if self.recompute is None:
            return self.module(stage, microbatch)(inp)
        return self.recompute.forward(self.module(stage, microbatch), inp, stage, microbatch)

    def module(self, stage: int, microbatch: int | None = None) -> nn.Sequential:
        """The stage's layers; with weight versions, the version this microbatch's forward uses."""
        if self.versions is not None and microbatch is not None:
            return self.versions.module(stage, microbatch)
        return self.stages.modules[stage]

    def take_local(self, producer: Action) -> torch.Tensor:
        """An output a stage on this rank left for a later step (kept until its last reader)."""
        entry = self.local[producer]
        entry[1] -= 1
        if entry[1] == 0:
            del self.local[producer]
        return entry[0]
