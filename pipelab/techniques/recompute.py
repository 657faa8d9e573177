"""Activation recomputation: keep less after the forward, compute it again before the backward.

    cluster.run(sched, model=cfg, recompute="selective")        # none | full | selective | every-k
    cluster.run(sched, model=cfg, recompute={"policy": "every-k", "k": 2})
    cluster.run(sched, model=cfg, recompute=["full", "none"])   # one policy per stage

A policy names the *regions* of a stage's forward whose saved tensors are dropped: `full` each
transformer block, `every-k` runs of k blocks, `selective` each block's attention core (scores,
softmax, weighted sum; Korthikanti et al., arXiv 2205.05198). For a model pipelab did not write
(a `pl.CustomModel`) each of its layers is a segment, as a block is the GPT's: `full` and
`every-k` apply, `selective` is refused (it needs the GPT's attention core). During `F` a region keeps only its
input (a checkpoint); what autograd would have saved inside it is replaced by an empty slot. The
schedule's `R` action (`1R3`: recompute stage 1's forward of microbatch 3) runs every region of
its stage and microbatch again from its checkpoint and fills the slots, so the backward that
follows finds the very graph the forward built, with bit-identical tensors in it: gradients are
exact. `R` is placed right before its backward (`with_recompute`), or anywhere earlier on the
same rank after its `F` (a bubble, as in Lynx, Chen et al., arXiv 2406.08756; `with_recompute(...,
placement="early")` finds such places, recompute_placement.py) — the validator holds it to
that, because the backward's "saved activations" come from the `R`. With the I/W split, `R`
runs once, before `I`; `W` reads what `I` left and never recomputes.

This is torch's non-reentrant checkpointing (saved-tensor hooks that recompute by the order of
saves) made into a step of the schedule: the timeline shows it, the simulator costs it, and the
activation meter counts what it materialises. A backward that finds a slot still empty (no `R`
ran) recomputes that one region on the spot — Chen et al.'s (arXiv 1604.06174) segment-by-
segment checkpointing, which `sequential_peak` measures on one process.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..model.memory import POLICIES, check_policy, default_k
from ..model.gpt import AttentionCore, Block, ModelConfig, build_layers, layer_costs, loss_fn
from ..runtime.handlers import register_handler
from ..runtime.techniques import Technique, register_technique
from ..schedules.actions import Action
from ..schedules.base import Schedule
from ..schedules.kinds import Input, RECOMPUTE as RECOMPUTE_ROLE, SAVED, register_kind
from ..support.threads import one_thread
from .recompute_placement import RECOMPUTE, with_recompute  # noqa: F401  (re-exported)
from ..model.data import get_batch
from ..runtime.meter import ActivationMeter


@dataclass(frozen=True)
class Policy:
    """One stage's recomputation policy; `k` only for `every-k` (keep every k-th block input)."""
    name: str = "none"
    k: int | None = None

    def __str__(self) -> str:
        return self.name if self.k is None else f"{self.name} (k={self.k})"


# --- choosing policies --------------------------------------------------------------------------
def _one(value, stage: int | None) -> Policy:
    where = "recompute" if stage is None else f"recompute[{stage}]"
    if isinstance(value, Policy):
        value = {"policy": value.name, "k": value.k}
    if isinstance(value, str):
        value = {"policy": value}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a policy name ({', '.join(POLICIES)}), a dict such as "
                         f"{{'policy': 'every-k', 'k': 2}}, or a list with one per stage; "
                         f"got {value!r}")
    unknown = set(value) - {"policy", "k"}
    if unknown or "policy" not in value:
        raise ValueError(f"{where}: a dict needs 'policy' and may have 'k', got keys {sorted(value)}")
    try:
        k = check_policy(value["policy"], value.get("k"))
    except ValueError as err:
        if stage is None:
            raise
        raise ValueError(f"{where}: {err}") from None
    return Policy(value["policy"], k)


def policies(recompute, cfg: ModelConfig, bounds: list[tuple[int, int]]) -> tuple[Policy, ...]:
    """One Policy per stage from `cluster.run`'s `recompute=` (ValueError naming what is wrong).
    `every-k` without k takes √(the stage's blocks, or a custom model's layers), rounded
    (memory.default_k)."""
    stages = len(bounds)
    if recompute is None:
        recompute = "none"
    if isinstance(recompute, (list, tuple)):
        if len(recompute) != stages:
            raise ValueError(f"recompute: a list needs one policy per stage ({stages}), "
                             f"got {len(recompute)}")
        chosen = [_one(v, s) for s, v in enumerate(recompute)]
    else:
        chosen = [_one(recompute, None)] * stages
    out = []
    custom = not isinstance(cfg, ModelConfig)
    for (start, stop), p in zip(bounds, chosen):
        if custom and p.name == "selective":
            raise ValueError("recompute='selective' with a custom model: it drops what the GPT's "
                             "attention core saves, and this model's layers are not the GPT's; "
                             "use 'full' or 'every-k' (each of its layers is a segment)")
        if p.name == "every-k" and p.k is None:
            blocks = stop - start if custom else len(range(max(start, 1),
                                                           min(stop, cfg.n_layers + 1)))
            p = Policy("every-k", default_k(blocks))
        out.append(p)
    return tuple(out)


def prepare(schedule: Schedule, recompute, cfg: ModelConfig,
            bounds: list[tuple[int, int]]) -> tuple[Schedule, tuple[Policy, ...]]:
    """(the schedule to run, one policy per stage) for `cluster.run(..., recompute=...)`: R
    actions are added before each backward of a recomputing stage, unless the schedule places
    its own; a schedule with R on a stage that keeps everything is refused."""
    chosen = policies(recompute, cfg, bounds)
    active = [s for s, p in enumerate(chosen) if p.name != "none"]
    parts = [part for acts in schedule.actions for item in acts for part in item.parts]
    placed = {part.stage for part in parts if part.kind == RECOMPUTE}
    if placed - set(active):
        raise ValueError(f"schedule has recomputations (R) of stage(s) {sorted(placed - set(active))}, "
                         f"whose recompute policy is 'none': nothing would be dropped to "
                         f"recompute; pass recompute=... or remove the R actions")
    if not active:
        return schedule, ()
    if not placed:
        schedule = with_recompute(schedule, active)
    elif placed != set(active):
        raise ValueError(f"recompute: stage(s) {sorted(set(active) - placed)} drop activations, "
                         f"but the schedule recomputes only stage(s) {sorted(placed)}")
    else:          # a backward without its R would recompute inside itself, off the timeline
        redone = {(p.stage, p.microbatch) for p in parts if p.kind == RECOMPUTE}
        missing = sorted({(p.stage, p.microbatch) for p in parts
                          if p.kind in ("B", "I") and p.stage in placed} - redone)
        if missing:
            raise ValueError(f"recompute: the schedule's backwards of (stage, microbatch) "
                             f"{missing} have no R before them; every backward of a recomputing "
                             f"stage needs its own R (or leave R out: cluster.run adds them)")
    schedule.validate()
    return schedule, chosen


# --- the mechanism --------------------------------------------------------------------------------
class _Slot:
    """What autograd keeps instead of a dropped tensor: filled by the recomputation."""
    __slots__ = ("region", "tensor", "__weakref__")

    def __init__(self, region: "_Region"):
        self.region = region
        self.tensor = None


class _Region:
    """One recomputable piece of a forward: `run(*inputs)`, its checkpointed inputs, and the
    slots (weakly held: a slot dies with the graph node that holds it) in the order saved."""

    def __init__(self, run, inputs: tuple, meter):
        self.run, self.inputs, self.meter = run, inputs, meter
        self.slots: list[weakref.ref] = []
        if meter is not None:
            for t in inputs:
                meter.hold(t)

    def pack(self, tensor: torch.Tensor) -> _Slot:
        slot = _Slot(self)
        self.slots.append(weakref.ref(slot))
        return slot

    def recompute(self) -> None:
        """Run the region again (grad on, from detached checkpoints) and fill its slots with
        the tensors it saves this time, matched by the order of the saves."""
        if self.inputs is None:
            return                                  # done already
        meter, saved = self.meter, []

        def collect(t):
            saved.append(meter.count_saved(t) if meter is not None else t.detach())
            return None
        inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in self.inputs)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(collect, _unpack):
            self.run(*inputs)
        if len(saved) != len(self.slots):
            raise RuntimeError(f"recomputation saved {len(saved)} tensors where the forward "
                               f"saved {len(self.slots)}: the region is not deterministic")
        for ref, tensor in zip(self.slots, saved):
            slot = ref()
            if slot is not None:
                slot.tensor = tensor
        if meter is not None:
            for t in self.inputs:
                meter.drop(t)
        self.inputs = None


def _unpack(slot):
    if isinstance(slot, _Slot):
        if slot.tensor is None:
            slot.region.recompute()        # no R ran: recompute this region now (lazily)
        return slot.tensor
    return slot


def _blocks_of(module: nn.Module) -> list[nn.Module]:
    return list(module) if isinstance(module, nn.Sequential) else [module]


def is_block(layer: nn.Module) -> bool:
    """A segment of the toy GPT: a transformer block (the embedding and head are never dropped)."""
    return isinstance(layer, Block)


def any_layer(layer: nn.Module) -> bool:
    """A segment of a custom model: each of its layers."""
    return True


class Recomputer:
    """One rank's recomputation state for a training step: per (stage, microbatch), the regions
    its forward dropped, until `recompute` (the `R`) restores them. `segment` says which layers
    `full` and `every-k` checkpoint (`is_block`, or `any_layer` for a custom model)."""

    def __init__(self, policies_by_stage: dict[int, Policy], meter=None, segment=is_block):
        self.policies = policies_by_stage
        self.meter = meter
        self.segment = segment
        self.pending: dict[tuple[int, int], list[_Region]] = {}

    def forward(self, module: nn.Module, x: torch.Tensor, stage: int, microbatch: int):
        """The stage's forward under its policy, remembering what to recompute."""
        policy = self.policies.get(stage, Policy())
        if policy.name == "none":
            return module(x)
        regions = self.pending.setdefault((stage, microbatch), [])
        if policy.name == "selective":
            return self._selective(module, x, regions)
        k = 1 if policy.name == "full" else policy.k
        out, layers, i = x, _blocks_of(module), 0
        while i < len(layers):
            if not self.segment(layers[i]):
                out, i = layers[i](out), i + 1
                continue
            j = i
            while j < len(layers) and j - i < k and self.segment(layers[j]):
                j += 1
            single = isinstance(out, torch.Tensor)   # else a custom layer's tuple of tensors
            out = self._checkpointed(_Chain(layers[i:j], single),
                                     (out,) if single else tuple(out), regions)
            i = j
        return out

    def _checkpointed(self, run, inputs: tuple, regions: list):
        region = _Region(run, inputs, self.meter)
        regions.append(region)
        with torch.autograd.graph.saved_tensors_hooks(region.pack, _unpack):
            return run(*inputs)

    def _selective(self, module: nn.Module, x: torch.Tensor, regions: list):
        """Run the stage with each attention core checkpointed (hooks around the core's call)."""
        entered = []

        def before(core, args):
            region = _Region(core, args, self.meter)
            regions.append(region)
            hooks = torch.autograd.graph.saved_tensors_hooks(region.pack, _unpack)
            hooks.__enter__()
            entered.append(hooks)

        def after(core, args, output):
            entered.pop().__exit__(None, None, None)
        cores = [m for m in module.modules() if isinstance(m, AttentionCore)]
        handles = [h for c in cores for h in (c.register_forward_pre_hook(before),
                                              c.register_forward_hook(after))]
        try:
            return module(x)
        finally:
            for h in handles:
                h.remove()
            while entered:
                entered.pop().__exit__(None, None, None)

    def recompute(self, stage: int, microbatch: int) -> int:
        """The `R` of (stage, microbatch): every dropped region recomputed; their number."""
        key = (stage, microbatch)
        if key not in self.pending:
            policy = self.policies.get(stage, Policy())
            raise RuntimeError(f"{stage}R{microbatch}: nothing to recompute (policy {policy} on "
                               f"stage {stage}); its forward has not run, or R ran twice")
        regions = self.pending.pop(key)
        for region in regions:
            region.recompute()
        return len(regions)


class _Chain:
    """Blocks run one after the other: a segment of `full` (one block) or `every-k` (k). Its
    checkpoints are its input tensor (`single`), or each tensor of the tuple a custom model's
    layer receives (the tuple rebuilt to run it)."""

    def __init__(self, layers, single: bool = True):
        self.layers, self.single = list(layers), single

    def __call__(self, *inputs):
        x = inputs[0] if self.single else tuple(inputs)
        for layer in self.layers:
            x = layer(x)
        return x


# --- the kind and its handler ---------------------------------------------------------------------
def _recompute_inputs(schedule, a: Action) -> list[Input]:
    return [Input("saved", Action(a.stage, "F", a.microbatch), False)]


register_kind(RECOMPUTE, "recompute the forward's dropped activations", inputs=_recompute_inputs,
              output=SAVED, cost=lambda costs, stage: costs.of("F", stage),
              stage_costs=lambda costs, stages: costs.of_stages("F", stages), module="pipelab",
              role=RECOMPUTE_ROLE, colour="#DA8BC3", label="recompute")


@register_handler(RECOMPUTE)
def recompute_handler(state, a: Action, inputs: dict) -> None:
    """Fill the slots the stage's forward left for this microbatch (the backward reads them)."""
    state.recompute.recompute(a.stage, a.microbatch)
    return None


# --- on one process: segment-by-segment checkpointing ---------------------------------------------
def sequential_peak(cfg: ModelConfig, rows: int, policy: str = "none", k: int | None = None,
                    seed: int = 0) -> int:
    """Peak saved-activation bytes of one forward and backward of the whole model on one
    process, with no `R`: each dropped region is recomputed when the backward reaches it, so
    only one segment is back at a time — Chen et al.'s setting, where keeping every k-th input
    costs ⌈n/k⌉ checkpoints plus one segment of k blocks."""
    layers = build_layers(cfg, 0, cfg.total_layers)
    bounds = [(0, cfg.total_layers)]
    chosen = policies({"policy": policy, "k": k} if k is not None else policy, cfg, bounds)
    meter = ActivationMeter(layers.parameters())
    x, y = get_batch(rows, cfg.seq_len, seed=seed)
    with one_thread():            # toy-sized ops: handing them to a second thread costs more
        with meter.saving():
            loss = loss_fn(Recomputer({0: chosen[0]}, meter).forward(layers, x, 0, 0), y)
        loss.backward()
    return meter.peak


def recompute_flops(cfg: ModelConfig, start: int, stop: int, rows: int, policy: str = "none") -> int:
    """Forward FLOPs the `R` of one microbatch of layers [start, stop) repeats: every block's
    (model.layer_costs) under `full` and `every-k`, the attention core's 4·rows·s²·h under
    `selective` (QKᵀ and the weighted sum; the softmax is not counted), none under `none`."""
    check_policy(policy)
    blocks = [r for r in layer_costs(cfg, rows)[start:stop] if r["kind"] == "block"]
    if policy == "none":
        return 0
    if policy == "selective":
        return len(blocks) * 4 * rows * cfg.seq_len ** 2 * cfg.d_model
    return sum(r["flops"] for r in blocks)


# --- in the runtime (runtime/techniques.py) ----------------------------------------------------
def prepare_run(draft) -> bool:
    """`cluster.run(..., recompute=...)`: one policy per stage, and R actions where needed."""
    draft.schedule, draft.recompute = prepare(draft.schedule, draft.options.get("recompute"),
                                              draft.cfg, draft.bounds())
    return bool(draft.recompute)


@contextmanager
def recompute_step(run, state):
    """Every forward of the step keeps only what its stage's policy keeps (StepState.forward)."""
    policies = run.spec.recompute
    segment = is_block if isinstance(run.spec.cfg, ModelConfig) else any_layer
    state.recompute = Recomputer({s: policies[s] for s in run.spec.schedule.stages_of(run.pp)},
                                 state.meter, segment)
    yield


register_technique(Technique("recompute", prepare=prepare_run, step=recompute_step))
