"""Data parallelism × pipeline: gradient all-reduces as actions in the schedule.

Each of `dp` replicas of the pipeline takes its share of the batch; after a stage's last
backward (or W) on a rank, the replicas sum that stage's gradients. Written as an action, `1AR`
("all-reduce stage 1's gradients"), it sits in the schedule right after the stage's last
backward, so the reduction of the last stage starts while the earlier stages are still in
their cool-down — the overlap Megatron and DeepSpeed get by bucketing gradients.

`AR` is registered once: ordering edges (carries=False) to every backward and W of its stage,
no microbatch, the communication lane (the rank's compute does not wait for it), and a cost
rule, the ring all-reduce 2(n−1)·latency + 2(n−1)/n · bytes / bandwidth, read from the cost model.
"""
from __future__ import annotations

from ..runtime.collectives import ALL_REDUCE
from ..runtime.techniques import Technique, register_technique
from ..schedules.actions import NO_MICROBATCH, Action
from ..schedules.base import Schedule
from ..schedules.kinds import KIND_SPECS, REDUCTION, Input, register_kind
from ..schedules.reductions import allreduce_time, gradient_inputs  # noqa: F401 - re-exported
from ..checks import positive_int


def _reduce_inputs(schedule, a: Action) -> list[Input]:
    """Ordering edges to every gradient-producing pass of the stage (reductions.py)."""
    return gradient_inputs(schedule, (a[0],))


def _reduce_cost(costs, stage: int) -> float:
    nbytes = costs.of_parameter_bytes(stage)
    return allreduce_time(nbytes, costs.replicas or 1, costs.bandwidth, costs.latency)


REDUCE = ALL_REDUCE     # "AR": the runtime's gradient all-reduce (collectives.py) runs it

def _reduce_stage_costs(costs, stages: int):
    """`_reduce_cost` of every stage at once (the ring's arithmetic works on arrays)."""
    return allreduce_time(costs.field_stages("parameter_bytes", stages), costs.replicas or 1,
                          costs.bandwidth, costs.latency)


register_kind(REDUCE, "all-reduce of the stage's gradients over its data-parallel replicas",
              inputs=_reduce_inputs, per_microbatch=False, lane="comm", cost=_reduce_cost,
              stage_costs=_reduce_stage_costs,
              module="pipelab", role=REDUCTION, colour="#333333", label="all-reduce")


def reduction_of(stage: int) -> Action:
    """The action `<stage>AR`."""
    return Action(stage, REDUCE, NO_MICROBATCH)


def with_data_parallel(schedule: Schedule, replicas: int = 2) -> Schedule:
    """The same schedule with each stage's gradient all-reduce inserted right after that stage's
    last backward (or W) on its rank; unchanged when `replicas` is 1 (nothing to reduce).

    A pure function: `schedule` is not modified. The result remembers `replicas` (the simulator
    charges the ring all-reduce over that many processes)."""
    positive_int("replicas", replicas)
    if replicas == 1:
        return schedule
    if has_reductions(schedule):
        raise ValueError(f"schedule {schedule.name!r} already has gradient all-reduces (AR)")
    actions = []
    for rank, acts in enumerate(schedule.actions):
        last = {}
        for i, item in enumerate(acts):
            for part in item.parts:
                if part.kind in ("B", "W", "I"):
                    last[part.stage] = i
        after: dict[int, list[int]] = {}
        for stage in schedule.stages_of(rank):
            if stage not in last:
                raise ValueError(f"stage {stage} has no backward on rank {rank}: nothing to reduce")
            after.setdefault(last[stage], []).append(stage)
        out = []
        for i, item in enumerate(acts):
            out.append(item)
            out += [reduction_of(s) for s in sorted(after.get(i, ()))]
        actions.append(out)
    result = Schedule(actions, schedule.placement, schedule.microbatches,
                      name=f"{schedule.name} × dp {replicas}", routes=schedule.routes,
                      slices=schedule.slices)
    result.data_parallel = replicas
    return result


def has_reductions(schedule) -> bool:
    return REDUCE in schedule.kinds()


# --- in the runtime (runtime/techniques.py) ----------------------------------------------------
def prepare_run(draft) -> bool:
    """`cluster.run(..., data_parallel=dp)`: the mesh must hold dp replicas of the pipeline,
    and each stage's gradient all-reduce is inserted unless the schedule has them. The replicas'
    process groups and gradient sums are the runtime's (mesh.py, collectives.py)."""
    dp, tp, schedule = draft.data_parallel, draft.tensor_parallel, draft.schedule
    if dp == 1:
        return False
    if any(KIND_SPECS[kind].collective for kind in schedule.kinds()):
        raise ValueError("data_parallel > 1 with a schedule that has collectives of its own "
                         "(members=...) is not supported yet: run it with data_parallel=1")
    if schedule.ranks * dp * tp != draft.ranks:
        ranks, need = draft.ranks, schedule.ranks * dp * tp
        shards = f" × {tp} tensor-parallel shards" if tp > 1 else ""   # counted, so said
        raise ValueError(
            f"the mesh is {schedule.ranks} pipeline ranks × {dp} data-parallel replicas{shards} = "
            f"{need} processes, but the cluster has {ranks}: use LocalCluster(ranks={need}), or "
            f"a schedule with ranks={ranks // (dp * tp) if ranks % (dp * tp) == 0 else '?'}")
    if not has_reductions(schedule):
        draft.schedule = with_data_parallel(schedule, dp).validate()
    return True


register_technique(Technique("data_parallel", prepare=prepare_run))
