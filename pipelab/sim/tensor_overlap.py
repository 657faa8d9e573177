"""How long a step takes when its passes end in tensor-parallel all-reduces (the simulator's model).

Every pass whose kind is registered with `tp_reduce` (F, I, and B's input-gradient half) ends
in an all-reduce of `Costs.tp_allreduce` seconds (T_AR, per stage). Whether the rank's compute
waits for it depends on what can run meanwhile:

* a lone F or I waits (exposed): the next layer of the same microbatch needs the sum;
* a lone B runs its W half while its input gradient is summed (Megatron's overlap): it waits
  only for what is left of the all-reduce after W;
* a braided step (a compound: STP's F+F, F+B, F+I, F+W) launches each all-reduce
  asynchronously, and the compute goes on with the other microbatch's work; the last
  all-reduce may outlive the step's compute (the *tail*), and then runs on the rank's
  communication lane under the next step — what the step sends waits for it.

With `Costs.tp_overlap=False` nothing overlaps: every all-reduce is added to its step.
All-reduces of one rank never overlap each other (one communication stream).
"""
from __future__ import annotations

import numpy as np

from ..schedules.kinds import BACKWARD, COMMUNICATION, KIND_SPECS, register_kind

Span = tuple[float, float, int]       # (start, end, which part it sums), from the step's start

TP_REDUCE = "Tp"      # the timelines' kind for one tensor-parallel all-reduce (never scheduled)

register_kind(TP_REDUCE, "tensor-parallel all-reduce (inside a forward or input-gradient pass)",
              lane="comm", module="pipelab", role=COMMUNICATION,
              colour="#17BECF", label="TP all-reduce")


def reduces(kind: str) -> bool:
    spec = KIND_SPECS.get(kind)
    return spec is not None and spec.tp_reduce


def step_time(costs, item, microbatches: int = 1) -> tuple[float, float, list[Span]]:
    """(compute time, tail, all-reduce spans) of one step under tensor parallelism."""
    parts = item.parts
    braided = len(parts) > 1 and costs.tp_overlap
    t = comm = 0.0                       # compute clock; when the communication stream is free
    spans: list[Span] = []
    for index, part in enumerate(parts):
        work = costs.duration(part, microbatches)
        ar = costs.of_tp_allreduce(part.stage) if reduces(part.kind) else 0.0
        # A full backward is I then W: its all-reduce can run under the W half.
        after = costs.of("W", part.stage) \
            if KIND_SPECS[part.kind].role == BACKWARD and costs.tp_overlap else 0.0
        t += work - after
        if ar:
            begin = max(t, comm)
            comm = begin + ar
            spans.append((begin, comm, index))
            if not costs.tp_overlap or (not braided and not after):
                t = comm                 # nothing else to do meanwhile: wait for the sum
        t += after
    if not braided:
        return max(t, comm), 0.0, spans
    return t, max(0.0, comm - t), spans


def lone_step_times(costs, kind: str, stages: int) -> np.ndarray:
    """`step_time(costs, Action(s, kind, j))[0]` of a lone (not braided) action of `kind` on
    every stage s < `stages` at once, with a per-microbatch table: `step_time`'s float
    operations, stage by stage in numpy (the planner's bound asks for thousands of tables)."""
    work = costs.of_stages(kind, stages)
    ar = costs.field_stages("tp_allreduce", stages) if reduces(kind) else np.zeros(stages)
    after = costs.of_stages("W", stages) \
        if KIND_SPECS[kind].role == BACKWARD and costs.tp_overlap else np.zeros(stages)
    t = work - after
    summed = ar != 0                              # `if ar:` above
    comm = np.where(summed, np.maximum(t, 0.0) + ar, 0.0)
    waits = summed & ((not costs.tp_overlap) | (after == 0))
    t = np.where(waits, comm, t) + after
    return np.maximum(t, comm)


def data_edge(schedule, step, before) -> bool:
    """Whether `step` reads data `before` produced (an activation or a gradient), rather than
    only following it (W after its I, a backward after its own forward)."""
    made = set(before.parts)
    return any(edge[2] and edge[1] in made for part in step.parts
               for edge in KIND_SPECS[part[1]].inputs(schedule, part))


def bubbles(timeline, costs) -> dict[int, dict[str, float]]:
    """Per rank, the two bubbles of the closed forms, read off a simulated timeline: "tp" the
    all-reduce time its compute waited through (each step's time beyond its passes' costs),
    "pp" the idle time within its span (first start to last end), and "span"."""
    costs = costs.for_schedule(timeline.schedule)      # a rank's worth: per stage, as simulated
    out = {}
    for rank in range(timeline.ranks):
        steps = [e for e in timeline.events_of(rank) if not reduces_nothing(e.action)]
        work = sum(costs.duration(part) for e in steps for part in e.action.parts)
        busy = sum(e.duration for e in steps)
        span = max(e.end for e in steps) - min(e.start for e in steps)
        out[rank] = {"tp": busy - work, "pp": span - busy, "span": span}
    return out


def reduces_nothing(action) -> bool:
    """A communication-lane event (an all-reduce itself), not a step of compute."""
    spec = KIND_SPECS.get(action.kind if len(action.parts) == 1 else "")
    return spec is not None and spec.lane == "comm"
