"""Weight versions on one rank: what `U` actions make and stashed forwards read.

Each stage starts with one version, its module. A forward of microbatch mb runs the version the
schedule's `version_plan` names for it (updates.py); its backward then walks the graph that
forward saved, so it reads — and accumulates its gradient into — the same version, however many
updates happened in between (weight stashing). An update `sU<mb>`:

1. sums the gradient accumulated in every version of the stage since the previous update and
   turns it into the mean over the microbatches it covers;
2. makes a new version: the newest one − lr × that mean (plain SGD: the one-process
   emulation in async_staleness.py applies the same rule with the same `sgd_step`);
3. frees the versions no later action reads.

The versions are parameters, not activations: the activation meter is told about each new
version's tensors (forwards save weights for their backward, and those must not be counted),
and their bytes are tracked here, per rank, as parameter memory.
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..schedules import Action
from ..schedules.updates import SELECT, UPDATE, check_updates, covered, has_updates, version_plan
from ..runtime.handlers import register_handler
from ..runtime.stage import layer_names
from ..runtime.techniques import Technique, register_technique
from .async_staleness import check_run, sgd_step


def _bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class WeightVersions:
    """The live versions of the stages on one rank, and the parameter bytes they hold."""

    def __init__(self, schedule, stages, lr: float, meter, record: bool = False):
        self.schedule = schedule
        self.plan = version_plan(schedule)
        self.lr = lr
        self.meter = meter
        self.record = record                  # keep each update's gradient and result (checks)
        self.bounds = stages.bounds
        # Every microbatch's loss is scaled by 1/M (M: all microbatches of the run, see the F
        # handler); an update covering n of them applies the mean, M/n × the sum.
        self.total = schedule.microbatches
        self.live = {s: {None: module} for s, module in stages.modules.items()}
        self.newest: dict[int, Action | None] = {s: None for s in stages.modules}
        self.spare: dict[int, list] = {s: [] for s in stages.modules}   # freed, for reuse
        self.bytes = sum(_bytes(m) for m in stages.modules.values())
        self.history: list[tuple[float, int]] = [(time.perf_counter(), self.bytes)]
        self.peak = self.bytes
        self.most = {s: 1 for s in stages.modules}
        self.updates: dict[str, dict] = {}

    def module(self, stage: int, microbatch: int):
        """The version microbatch `microbatch`'s forward on `stage` runs."""
        return self.live[stage][self.plan.source.get((stage, microbatch))]

    def update(self, a: Action) -> None:
        stage = a.stage
        versions = self.live[stage]
        # 1. The gradient accumulated since the previous update, in whichever versions hold it.
        base = versions[self.newest[stage]]
        total: list = [None] * len(list(base.parameters()))
        for module in versions.values():
            for i, p in enumerate(module.parameters()):
                if p.grad is not None:
                    total[i] = p.grad if total[i] is None else total[i] + p.grad
            module.zero_grad(set_to_none=True)
        microbatches = covered(self.schedule, a)
        mean = [torch.zeros_like(p) if g is None else g * (self.total / len(microbatches))
                for g, p in zip(total, base.parameters())]
        # 2. The new version, from the newest, written into a freed version's tensors when
        # there is one (a copy of the module costs more than the update itself).
        spare = self.spare[stage]
        new = spare.pop() if spare else copy.deepcopy(base)
        with torch.no_grad():
            for p, b, g in zip(new.parameters(), base.parameters(), mean):
                sgd_step(b, g, self.lr, out=p)
        versions[a] = new
        self.newest[stage] = a
        self.meter.add_parameters(new.parameters())
        self.bytes += _bytes(new)
        # 3. Free what no later action reads.
        for old in self.plan.retire.get(a, ()):
            module = versions.pop(old)
            self.meter.remove_parameters(module.parameters())
            self.bytes -= _bytes(module)
            self.spare[stage].append(module)     # no graph reads it any more: reusable
        self.most[stage] = max(self.most[stage], len(versions))
        self.peak = max(self.peak, self.bytes)
        self.history.append((time.perf_counter(), self.bytes))
        if self.record:
            names = layer_names(new, self.bounds[stage][0])
            self.updates[str(a)] = {
                "microbatches": list(microbatches),
                "grad": {name: g.clone() for name, g in zip(names, mean)},
                "weights": {name: p.detach().clone() for name, p in zip(names, new.parameters())}}

    def report(self) -> dict:
        return {"history": self.history, "peak": self.peak, "most": dict(self.most),
                "updates": self.updates}


def weight_versions(spec, stages, meter):
    """The rank's WeightVersions when the schedule has updates, else None (nothing changes)."""
    sched = spec.schedule
    if not has_updates(sched):
        return None
    return WeightVersions(sched, stages, spec.lr, meter, record=spec.check)


def check_versioned_run(schedule, steps: int) -> None:
    """A schedule with updates holds its whole training run: refuse what would repeat or split
    it, before any worker starts."""
    if not has_updates(schedule):
        return
    check_updates(schedule)
    if steps != 1:
        raise ValueError(f"steps={steps}: schedule {schedule.name!r} has its own optimizer updates "
                         f"(U actions) and runs as one continuous stream; use steps=1 and more "
                         f"microbatches")
    if getattr(schedule, "data_parallel", 1) > 1 or "AR" in schedule.kinds():
        raise ValueError(f"data_parallel > 1 is not supported with schedule {schedule.name!r}, "
                         f"which updates weights inside itself (U actions): run it with "
                         f"data_parallel=1")


@register_handler(UPDATE)
def apply_update(state, a: Action, inputs: dict) -> None:
    """`sU<mb>`: a plain SGD step of stage s on the gradient of the microbatches it covers."""
    state.versions.update(a)
    return None


@register_handler(SELECT)
def select_version(state, a: Action, inputs: dict) -> None:
    """`sV<mb>`: nothing to do at run time — the version plan already gives every forward after
    it the version sU<mb> made; the action is there so the schedule says so."""
    return None


@dataclass
class VersionsReport:
    """Weight versions of a run: parameter bytes per rank (peak, and over time on the measured
    clock), most versions each stage held, and the check against the definitions (or None)."""
    weight_bytes: dict[int, int]
    weight_history: dict[int, list[tuple[float, int]]]
    most_versions: dict[int, int]
    check: object | None = None
    last_weights: dict = None          # with check: each stage's newest version, by ToyGPT name


def assemble_versions(spec, reports: list[dict], result) -> VersionsReport:
    """Gather the ranks' version reports; with `spec.check`, compare with async_staleness.py's
    emulations and fill the result's reference fields from them."""
    t0 = min(rep["steps"][0]["begin"] for rep in reports)
    out = VersionsReport(
        weight_bytes={rep["rank"]: rep["versions"]["peak"] for rep in reports},
        weight_history={rep["rank"]: [(t - t0, b) for t, b in rep["versions"]["history"]]
                        for rep in reports},
        most_versions={s: n for rep in reports for s, n in rep["versions"]["most"].items()})
    if spec.check:
        updates = {u: rec for rep in reports for u, rec in rep["versions"]["updates"].items()}
        losses = {mb: loss for rep in reports for mb, loss in rep["steps"][0]["losses"].items()}
        out.check = check_run(spec, updates, losses)
        last = {}
        for u in sorted(updates, key=lambda text: Action.parse(text).microbatch):
            last.update(updates[u]["weights"])          # later updates overwrite their stage's
        out.last_weights = last
        refs = out.check.reference_losses
        result.reference_loss = sum(refs.values()) / len(refs)
        result.max_grad_error = out.check.grad_error
        result.grad_errors = out.check.grad_errors
    return out


# --- in the runtime (runtime/techniques.py) ----------------------------------------------------
def prepare_run(draft) -> bool:
    """A schedule with updates (U) runs once, as one stream; its check is the emulation's
    (async_staleness.py), not the unsplit model's gradients."""
    check_versioned_run(draft.schedule, draft.steps)
    if not has_updates(draft.schedule):
        return False
    draft.gradient_check = False
    return True


@contextmanager
def version_step(run, state):
    """The rank's weight versions for the step; afterwards what the updates made."""
    state.versions = weight_versions(run.spec, run.stages, state.meter)
    yield
    run.report["versions"] = state.versions.report()


def assemble_run(assembly) -> None:
    assembly.result.versions = assemble_versions(assembly.spec, assembly.reports, assembly.result)


register_technique(Technique("versions", prepare=prepare_run, step=version_step,
                             assemble=assemble_run))
