"""The planner against reality: run a candidate live and put its predictions beside what ran.

Step time, two ways: `measured_time`, the median makespan of the measured training steps (wall
clock, first step left out: it pays for warm-up), and `replayed_time`, the last step's
actions at their measured CPU times placed by the simulator — what dedicated cores would show,
and the fair comparison on a machine whose cores the ranks share with other work. Peak memory per device: the activation meter's peak (bytes autograd
saved for backward, runtime/meter.py) plus the parameters, gradients and optimizer state of the
rank's stages, counted from the live run's stages (RunResult.stage_parameter_bytes) — the static part
is not sampled from the process (its RSS holds torch itself), the activations are. The static
part is counted on the rank's stages built as its worker builds them (`held_bytes`).
"""
from __future__ import annotations

import inspect
import statistics

from .plan import Candidate, MiB, Plan, POLICIES
from ..techniques.tensor import TensorParallel
from ..runtime.handlers import run_setups
from ..runtime.stage import RankStages
from ..techniques.expert import place_experts


def runnable_policies(cluster) -> tuple[str, ...]:
    """The recomputation policies the cluster's runtime can run."""
    return POLICIES if "recompute" in inspect.signature(cluster.run).parameters else ("none",)


def can_run(candidate: Candidate, cluster) -> bool:
    """Whether `cluster` can run the candidate: as many processes as its devices, and a
    runtime that knows its recomputation policy."""
    if candidate.devices != cluster.ranks:
        return False
    return candidate.recompute in runnable_policies(cluster)


def measure(candidate: Candidate, plan: Plan, cluster, *, steps: int = 3) -> dict:
    """Run `candidate` live on `cluster` (as many ranks as its devices) and return predicted
    and measured step time (s) and peak memory (bytes) side by side; "run" is the RunResult."""
    model = plan.cfg if plan.cfg is not None else getattr(plan.source, "custom", None)
    if model is None:                  # neither a config's plan nor a pl.CustomModel's
        raise ValueError("measure runs a pl.ModelConfig's or a pl.CustomModel's plan live; a "
                         "pl.ModelShape's plan is a prediction at a real model's scale, not "
                         "runnable on this machine")
    if not can_run(candidate, cluster):
        raise ValueError(f"cluster of {cluster.ranks} ranks cannot run {candidate.label()} "
                         f"({candidate.devices} devices, recompute {candidate.recompute})")
    extra = {"recompute": candidate.recompute} if candidate.recompute != "none" else {}
    res = cluster.run(candidate.build(), model=model, partition=candidate.bounds,
                      batch_size=plan.batch_size, steps=steps, check=False, progress=False,
                      data_parallel=candidate.data_parallel,
                      tensor_parallel=candidate.tensor, expert_parallel=candidate.expert, **extra)
    spans = [t.makespan for t in (res.timelines[1:] or res.timelines)]
    sched = res.schedule
    held = {r: held_bytes(res.spec, r) for r in range(sched.ranks)}      # tensor shard 0
    live = res.peak_activations          # per pipeline rank (its replicas' and shards' alike)
    measured = {r: held[r] + live[r] for r in held}
    return {"candidate": candidate.label(),
            "predicted_time": candidate.step_time, "measured_time": statistics.median(spans),
            "replayed_time": res.replay.makespan,
            "predicted_peak": candidate.peak_memory, "measured_peak": max(measured.values()),
            "predicted_activations": max(candidate.activation_peak),
            "measured_activations": max(live.values()), "activations_by_rank": live,
            "run": res}


def held_bytes(spec, rank: int, shard: int = 0) -> int:
    """Bytes pipeline rank `rank` of a run holds outside activations, counted on its stages
    built as the worker builds them (vocabulary shards included; tensor-parallel `shard`):
    the parameters, as many gradients, and the state torch's AdamW makes after one step."""
    import torch

    tp = TensorParallel(spec.tensor_parallel, shard) if spec.tensor_parallel > 1 else None
    stages = RankStages(spec.cfg, spec.bounds, spec.schedule.stages_of(rank), tp)
    run_setups(spec, rank, stages)
    if spec.expert_parallel > 1:       # replica 0's share of the experts
        place_experts(stages.modules.values(), None, 0, spec.expert_parallel)
    params = stages.parameters()
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(params)
    optimizer.step()
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    return 2 * sum(p.nbytes for p in params) + state


def table(rows: list[dict]) -> str:
    """Predicted vs measured (and replayed) step time and peak memory, one line per candidate,
    with the relative errors."""
    head = (f"{'candidate':<50} {'pred ms':>8} {'meas ms':>8} {'err':>5} {'repl ms':>8} "
            f"{'err':>5} {'pred MiB':>9} {'meas MiB':>9} {'err':>5}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['candidate']:<50} {r['predicted_time'] * 1e3:8.2f} "
                     f"{r['measured_time'] * 1e3:8.2f} {error(r, 'time'):5.0%} "
                     f"{r['replayed_time'] * 1e3:8.2f} {error(r, 'time', 'replayed'):5.0%} "
                     f"{r['predicted_peak'] / MiB:9.2f} {r['measured_peak'] / MiB:9.2f} "
                     f"{error(r, 'peak'):5.0%}")
    return "\n".join(lines)


def error(row: dict, what: str, against: str = "measured") -> float:
    """(predicted − measured) / measured for "time", "peak" or "activations"; against
    "replayed" for the replayed step time."""
    return (row[f"predicted_{what}"] - row[f"{against}_{what}"]) / row[f"{against}_{what}"]
