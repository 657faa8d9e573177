"""Expert parallelism: the experts of every MoE layer divided over the data-parallel group.

    cluster.run(sched, model=cfg, expert_parallel=2)      # LocalCluster(ranks=pp × 2)

With `expert_parallel=n` the mesh has n data-parallel replicas of the pipeline; in each MoE
layer, replica d holds experts d·E/n … (d+1)·E/n − 1 only. Every replica routes its own tokens
(the router is a dense, replicated parameter), then:

1. **split sizes**: each process tells every other how many rows it will send to each of that
   process's experts (an `all_to_all_single` of E integers);
2. **dispatch**: the rows go to their experts' processes (`all_to_all_single` with uneven
   splits, taken from step 1);
3. the experts run on everything they received, from every replica;
4. **combine**: the results go back by the reverse all-to-all.

Backward runs the two all-to-alls in reverse (gradients of the combined rows to the experts,
gradients of the dispatched rows home). Dense parameters are summed over the group as in data
parallelism (`AR`); expert parameters are not: each expert saw every replica's tokens, so its
gradient is already the whole batch's. Routing is per sequence (moe.py), so the decisions are
exactly those of the single-process model on the whole batch.

All replicas run the same schedule, so they reach each MoE layer of each microbatch together —
the all-to-all is a collective inside F and B. Each one is timed and shown on the rank's
communication lane (kinds `Ed` dispatch and `Ec` combine); a process waiting in one marks the
progress board, so a stuck all-to-all times out naming the process that never came. Under an
emulated link (runtime/link.py) each all-to-all completes no earlier than (n−1)·α +
(n−1)/n · bytes/β after the last process posted it, bytes being what this process sends.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..model import moe
from ..runtime.board import IN_ALL_TO_ALL
from ..runtime.stage import mark_replica_own
from ..runtime.techniques import Technique, register_technique
from ..schedules.actions import Action
from ..schedules.kinds import COMMUNICATION, register_kind
from .expert_routing import routing_of
from ..checks import positive_int
from ..runtime.link import collective

DISPATCH, COMBINE = "Ed", "Ec"

register_kind(DISPATCH, "expert dispatch: all-to-all of tokens to their experts' processes "
              "(recorded inside F and B, on the communication lane)", lane="comm",
              cost=lambda costs, stage: 0.0, module="pipelab", role=COMMUNICATION,
              colour="#8C8C8C", label="dispatch")
register_kind(COMBINE, "expert combine: all-to-all of expert outputs back to their tokens' "
              "processes (recorded inside F and B, on the communication lane)", lane="comm",
              cost=lambda costs, stage: 0.0, module="pipelab", role=COMMUNICATION,
              colour="#CCB974", label="combine")


class GroupExchange:
    """Moves rows between the processes of `group` (this one is `index` of `size`), each holding
    `local` consecutive experts. `on_wait(detail)` marks the progress board around each
    blocking all-to-all (detail IN_ALL_TO_ALL inside it, 0 after)."""

    def __init__(self, group, index: int, size: int, local: int, on_wait=None, link=None):
        self.group, self.index, self.size, self.local = group, index, size, local
        self.on_wait = on_wait or (lambda detail: None)
        self.link = link

    def all_to_all(self, out, rows, recv, send, kind: str, layer: int) -> None:
        self.on_wait(IN_ALL_TO_ALL)
        start = time.perf_counter()
        rows = rows.contiguous()
        nbytes = rows.numel() * rows.element_size()
        if self.link is None:
            dist.all_to_all_single(out, rows, recv, send, group=self.group)
        else:
            seconds = self.link.all_to_all_time(nbytes, self.size)
            collective(lambda: dist.all_to_all_single(out, rows, recv, send, group=self.group,
                                                      async_op=True),
                       self.group, seconds, self.link).wait()
            if moe.LOG is not None:      # what the simulator charges the pass it ran in
                moe.LOG.append(("link", start, seconds))
        if moe.LOG is not None and kind:
            moe.LOG.append(("a2a", start, time.perf_counter(), kind, layer,
                            nbytes))
        self.on_wait(0)

    def dispatch(self, counts: torch.Tensor, rows: torch.Tensor, layer: int):
        recv_counts = torch.empty_like(counts)
        self.all_to_all(recv_counts, counts, None, None, "", layer)     # the split sizes
        recv_counts = recv_counts.view(self.size, self.local)
        send = counts.view(self.size, self.local).sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        handle = (send, recv)
        return recv_counts, _AllToAll.apply(rows, self, send, recv, DISPATCH, layer), handle

    def combine(self, rows: torch.Tensor, handle, layer: int) -> torch.Tensor:
        send, recv = handle
        return _AllToAll.apply(rows, self, recv, send, COMBINE, layer)


class _AllToAll(torch.autograd.Function):
    """Rows out by `send` sizes, in by `recv` sizes; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, rows, ex: GroupExchange, send, recv, kind, layer):
        ctx.args = (ex, send, recv, kind, layer)
        out = rows.new_empty((sum(recv),) + rows.shape[1:])
        ex.all_to_all(out, rows, recv, send, kind, layer)
        return out

    @staticmethod
    def backward(ctx, grad):
        ex, send, recv, kind, layer = ctx.args
        out = grad.new_empty((sum(send),) + grad.shape[1:])
        ex.all_to_all(out, grad, send, recv, kind, layer)
        return out, None, None, None, None, None


def place_experts(modules, group, index: int, size: int, on_wait=None, link=None) -> None:
    """Keep only process `index`'s share of every MoE layer's experts in `modules` and route
    through `group`; the kept experts' parameters are the replica's own (not all-reduced)."""
    for module in modules:
        for layer in module.modules():
            if not isinstance(layer, moe.MoEMLP):
                continue
            local = layer.n_experts // size
            mine = range(index * local, (index + 1) * local)
            for name in [n for n in layer.experts if int(n) not in mine]:
                del layer.experts[name]
            for p in layer.experts.parameters():
                mark_replica_own(p)
            layer.exchange = GroupExchange(group, index, size, local, on_wait, link)


def check_expert_parallel(cfg, expert_parallel: int, data_parallel: int) -> int:
    """The data-parallel degree a run with `expert_parallel` needs; ValueError if it cannot be."""
    ep = positive_int("expert_parallel", expert_parallel)
    if ep == 1:
        return data_parallel
    if not cfg.moe:
        raise ValueError(f"expert_parallel={ep} needs a mixture-of-experts model: "
                         f"pl.ModelConfig(..., n_experts=E) with E a multiple of {ep}")
    if cfg.n_experts % ep:
        raise ValueError(f"expert_parallel={ep} must divide ModelConfig.n_experts "
                         f"({cfg.n_experts}): each process holds n_experts / expert_parallel")
    if data_parallel not in (1, ep):
        raise ValueError(f"expert_parallel={ep} divides the experts over the data-parallel group, "
                         f"so data_parallel must be {ep} (or left at 1), got {data_parallel}")
    return ep


# --- on each process, after a step: the layers' records as timeline events and counts --------
def step_records(records: list, actions: list) -> tuple[list, list, dict]:
    """Split a step's moe.LOG records into (events, routing, link): each all-to-all becomes an
    event (its action, start, end, cpu=None) of kind Ed/Ec for the stage and microbatch of the
    action it ran inside; each routing record becomes (microbatch, layer, routed, dropped);
    under an emulated link, `link[action]` sums the link's time for the all-to-alls (split
    sizes included) that ran inside that action."""
    spans = [(start, end, item) for _i, item, _w, start, end, _c, _m in actions]
    events, routing, link = [], [], {}
    for rec in records:
        t = rec[1]
        inside = next((item for start, end, item in spans if start <= t <= end), None)
        if inside is None:
            continue
        part = inside.parts[0]
        if rec[0] == "link":
            link[part] = link.get(part, 0.0) + rec[2]
        elif rec[0] == "a2a":
            _tag, start, end, kind, _layer, _nbytes = rec
            events.append((Action(part.stage, kind, part.microbatch), start, end, None))
        elif rec[0] == "route" and part.kind == "F":
            _tag, _t, layer, routed, dropped = rec
            routing.append((part.microbatch, layer, routed, dropped))
    return events, routing, link


# --- in the runtime (runtime/techniques.py) ----------------------------------------------------
def prepare_run(draft) -> bool:
    """`cluster.run(..., expert_parallel=ep)`: the data-parallel group becomes the expert group
    (data_parallel = ep). Every mixture-of-experts run records its routing and all-to-alls."""
    if draft.expert_parallel > 1:
        draft.data_parallel = check_expert_parallel(draft.cfg, draft.expert_parallel,
                                                    draft.data_parallel)
    return bool(draft.cfg.moe)


def setup_rank(run) -> None:
    """With expert parallelism, this replica keeps its share of every MoE layer's experts."""
    spec = run.spec
    if spec.expert_parallel > 1:
        place_experts(run.stages.modules.values(), run.group(spec.mesh.dp_group(run.pp)),
                      run.replica, spec.expert_parallel,
                      lambda detail: run.board.mark(run.rank, detail), spec.link)


@contextmanager
def record_step(run, state):
    """Record the step's MoE layers; afterwards their all-to-alls become timeline events, and
    their routing and link waits go into the step's report."""
    with moe.recording() as records:
        yield
    if records:
        step = run.report["steps"][-1]
        events, step["routing"], step["link_waits"] = step_records(records, step["actions"])
        step.setdefault("events", []).extend(events)


def assemble_run(assembly) -> None:
    """Per step, the tokens each expert was sent and dropped (expert_routing.py)."""
    steps = len(assembly.reports[0]["steps"])
    assembly.result.routing = [
        routing_of([rep["steps"][k] for replica in assembly.replicas for rep in replica],
                   assembly.spec.schedule.microbatches) for k in range(steps)]


register_technique(Technique("experts", prepare=prepare_run, setup=setup_rank, step=record_step,
                             assemble=assemble_run))
