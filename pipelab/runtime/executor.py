"""One rank's part of a pipeline run: its actions in order, with the messages around them.

The executor knows nothing about particular schedules or action kinds. For each `Step` of the
communication plan (derived from the schedule's dataflow graph, never written by hand) it
receives what the step waits for, hands each action its inputs (from messages, or from a stage
on this rank), runs the action's handler, and posts the sends. It records, per step, the
wall-clock span of its compute (receive wait excluded, kept separately; the span ends before
the sends are posted, whose posting is kept separately too), thread CPU time (sends included)
and live activation bytes after it. Under an emulated link (spec.link) the receive waits and
the collectives sleep until the link's deadline (runtime/link.py): never counted as an
action's CPU time, and without taking a core from the other ranks. The same function runs in a
LocalCluster worker and under torchrun.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..model.gpt import ModelConfig, ToyGPT, loss_fn
from ..model.source import take_rows
from ..model.moe import loss_share
from ..schedules import comm_plan
from . import p2p
from .board import DONE, IN_REDUCTION, OPTIM, RECV, RUN, SENDS, SETUP, SYNC, NoBoard
from ..model.weight_grad import WeightGradStore
from .handlers import HANDLERS, run_setups
from . import collectives  # noqa: F401  (registers the AR and G handlers)
from .heap import keep_freed_memory
from .plugins import collective_groups, import_plugins, process_group
from .meter import ActivationMeter
from .sampling import sampled_forwards
from .spec import RunSpec
from .stage import RankStages, StepState, replica_own
from .techniques import around_step, setup_all, walk


@dataclass
class RankRun:
    """One process's run, as the techniques' setup and step hooks see it (techniques.py)."""
    spec: RunSpec
    rank: int                          # the process, in the mesh
    pp: int                            # its coordinates: pipeline rank, replica, shard
    replica: int
    shard: int
    stages: RankStages
    board: object
    report: dict = field(default_factory=dict)

    @staticmethod
    def group(members: tuple[int, ...]):
        """The process group of `members` (made by every rank before the run)."""
        return process_group(members)

def run_rank(spec: RunSpec, rank: int, board=None, notify=None) -> dict:
    """Run every training step of `spec` as `rank` (torch.distributed must be initialised).

    Returns a plain, picklable report; `notify(step, loss)` is called by the rank holding the
    last stage after each step (the parent's progress bar).

    `rank` is the process's place in the mesh (mesh.py): pipeline rank `pp` of
    data-parallel replica `dp`. The replica runs the schedule's actions of rank `pp` on its
    share of the batch, exchanges messages with its own replica's neighbours, and sums
    gradients with the other replicas in the schedule's `AR` actions.
    """
    if spec.engine == "torch":         # torch's own runtime runs the exported schedule
        from .torch_engine import run_rank as run_on_torch
        return run_on_torch(spec, rank, board, notify)
    board = board or NoBoard()
    board.set(rank, 0, 0, SETUP)
    import_plugins(spec.plugins)       # kinds and handlers defined outside pipelab
    sched, mesh = spec.schedule, spec.mesh
    pp, replica, shard = mesh.coords(rank)
    plan = _in_replica(comm_plan(sched)[pp], mesh, replica, shard)
    wiring = _wiring(spec, plan)
    for members in collective_groups(sched):     # every rank makes every group, in one order
        process_group(members)
    if mesh.dp > 1 or mesh.tp > 1:
        for members in mesh.groups().values():   # the mesh's named groups, same order everywhere
            process_group(members)
    stages = RankStages(spec.cfg, spec.bounds, sched.stages_of(pp), crossing=spec.crossing())
    walk.clear()                       # from here: the technique hooks this run enters
    run = RankRun(spec, rank, pp, replica, shard, stages, board)
    setup_all(spec.techniques, run)    # the run's techniques adapt what the rank holds
    run_setups(spec, pp, stages)       # kinds that bring parameters of their own add them here
    params = stages.parameters()
    sample, run.report["meter"] = sampled_forwards(spec, plan)   # the forwards the meter hooks
    optimizer = torch.optim.AdamW(params, lr=spec.lr) if spec.steps > 1 else None
    # The progress bar shows the loss of the first route's microbatches (all of them but on a
    # bidirectional schedule).
    holds_loss = sched.rank_of(sched.loss_stages()[0]) == pp and replica == 0 and shard == 0
    batches = spec.model.batches(spec.batch_size, spec.seed)   # the same ones on every rank
    report = run.report                # the step hooks add to it
    report.update({"rank": rank, "coords": (pp, replica), "shard": shard, "pid": os.getpid(),
                   "steps": [], "grads": None,
                   "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
                   # what each stage's gradient all-reduce (AR, G) moves: a replica's own
                   # parameters (its experts) stay unsummed
                   "reduced_bytes": {s: sum(p.numel() * p.element_size()
                                            for p in module.parameters() if not replica_own(p))
                                     for s, module in stages.modules.items()}})
    rows = slice(replica * spec.rows_per_replica, (replica + 1) * spec.rows_per_replica)
    for k in range(spec.steps):
        inputs, targets = next(batches)
        # this replica's share of the batch
        inputs, targets = take_rows(inputs, rows), take_rows(targets, rows)
        stages.zero_grad()
        meter = ActivationMeter(params, sample)
        state = StepState(sched, stages, inputs, targets, meter)
        state.replicas = mesh.dp
        state.dp_group = process_group(mesh.dp_group(pp, shard)) if mesh.dp > 1 else None
        state.link = spec.link             # an emulated link the reductions wait out (or None)
        # The techniques' step hooks set up before the barrier, so that no rank starts late.
        with around_step(spec.techniques, run, state):
            board.set(rank, k, 0, SYNC)
            dist.barrier()             # every rank starts the step together: one time origin
            # Every forward this step (F, and a recomputation's) holds 1/(m · replicas) of the
            # batch loss: MoE layers scale their aux loss's gradient alike.
            with loss_share(1.0 / (state.m * state.replicas)):
                report["steps"].append(_run_step(spec, rank, k, plan, wiring, state, board))
        if k == 0 and spec.check and spec.gradient_check:
            # The replicas' summed gradients are equal: replica 0 reports them; each replica
            # reports those of the parameters it alone holds (its experts).
            report["grads"] = stages.gradients(None if replica == 0 else replica_own)
        if notify is not None and holds_loss:
            notify(k, sum(state.losses.values()) / state.m)
        # The last step's update is skipped: its weights are never used again (every run
        # rebuilds its stages from the config), and its gradients are what gets reported.
        if optimizer is not None and k < spec.steps - 1:
            board.set(rank, k, len(plan), OPTIM)
            optimizer.step()
    board.set(rank, spec.steps - 1, len(plan), DONE)
    report["walk"] = list(walk)        # the technique hooks this run entered here
    return report


def warm_up() -> None:
    """Prepare this process for honest timings: keep freed memory (heap.py), and run a tiny
    forward and backward through every code path the handlers use (full B, and I with its
    weight GEMMs deferred to W), so the first real action does not pay one-time costs (the
    first non-scalar backward of a process takes ~0.3 s) and distort the first timeline."""
    keep_freed_memory()
    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=1, seq_len=4)
    model = ToyGPT(cfg)
    idx = torch.zeros(1, 4, dtype=torch.long)
    meter = ActivationMeter(model.parameters())
    store = WeightGradStore(meter)
    with meter.saving():
        hidden = model.layers[0](idx)
        inner = hidden.detach().requires_grad_()
        middle = model.layers[1](inner)
        loss = loss_fn(model.layers[2](middle.detach().requires_grad_()), idx)
    torch.autograd.backward(loss)
    with store.deferring(1, 0):
        torch.autograd.backward(middle, torch.ones_like(middle))
    store.flush(1, 0)
    torch.autograd.backward(hidden, torch.ones_like(hidden))


def _in_replica(plan, mesh, replica: int, shard: int = 0):
    """The plan of one pipeline rank with its messages addressed to processes of `replica`
    (and of the same tensor-parallel `shard`: shard t of a stage talks to shard t of the next)."""
    if mesh.dp == 1 and mesh.tp == 1:
        return plan
    from dataclasses import replace
    out = []
    for step in plan:
        moved = {t: replace(t, src=mesh.rank(t.src, replica, shard),
                            dst=mesh.rank(t.dst, replica, shard))
                 for t in step.recv + step.send}
        out.append(replace(step, recv=[moved[t] for t in step.recv],
                           send=[moved[t] for t in step.send]))
    return out


def _stall(action) -> None:
    while True:                        # test hook: a stuck action; the parent's watchdog kills us
        time.sleep(0.5)


def _wiring(spec: RunSpec, plan) -> list:
    """Per step: (the receive shapes, and per part its handler and its inputs as (name, source)
    pairs, where source is ("recv", key) or ("local", producer)). Computed once per run."""
    sched = spec.schedule
    wiring = []
    for step in plan:
        received = {(t.consumer, t.name) for t in step.recv}
        parts = []
        own = set(step.action.parts)
        # Braided only where a technique has asynchronous work to hide (spec.braided).
        braided = len(own) > 1 and spec.braided
        for part in step.action.parts:
            sources = []
            for name, producer, carries in sched.inputs(part):
                if carries:
                    key = (part, name)
                    sources.append((name, ("recv", key) if key in received else ("local", producer)))
                    # a part reading another part of its step must run after it, not beside it
                    braided = braided and producer not in own
            handler = HANDLERS[part.kind]
            parts.append((part, handler.run, sources, handler.braid))
        braided = braided and any(braid for *_rest, braid in parts)
        shapes = [_shape(spec, t.producer) for t in step.recv]
        wiring.append((shapes, parts, braided))
    return wiring


def _shape(spec: RunSpec, producer) -> tuple:
    """Shape and dtype of what `producer` sends: its handler says, or the stage boundary's."""
    custom = HANDLERS[producer.kind].output
    return custom(spec, producer) if custom is not None else spec.message(producer)


def _run_step(spec: RunSpec, rank: int, k: int, plan, wiring, state: StepState, board) -> dict:
    stall, fail, drop, lag = (spec.inject.get(key) for key in ("stall", "raise", "drop", "lag"))
    if spec.inject_replica is not None and spec.mesh.coords(rank)[1] != spec.inject_replica:
        stall = fail = drop = lag = None
    reductions = state.in_flight
    log = state.stages.log              # spans a technique times inside an action, as they run
    log.clear()
    inside = []
    clock, cpu_clock = time.perf_counter, time.thread_time
    actions, recvs, sends, pending, peaks = [], [], [], [], []
    meter = state.meter
    begin = clock()
    memory = [(begin, state.meter.live)]
    arrived: dict = {}
    link = spec.link
    posted = _post(plan[0], wiring[0], link) if plan else []
    for i, step in enumerate(plan):
        item = step.action
        waited_from = clock()
        for j, (transfer, (handle, buffer)) in enumerate(zip(step.recv, posted)):
            board.set(rank, k, i, RECV, j)
            t = clock()
            handle.wait()
            arrived[(transfer.consumer, transfer.name)] = buffer
            recvs.append((transfer.producer, item, transfer.src, t, clock()))
        # Post the next step's receives before computing: never blocks, hides the transfer.
        posted = _post(plan[i + 1], wiring[i + 1], link) if i + 1 < len(plan) else []
        board.set(rank, k, i, RUN)
        meter.reset_peak()             # this action's own peak, whatever it frees by its end
        # A braided step runs its backward on a thread of its own (techniques/tensor_braid.py), which
        # the thread's clock would not see: its CPU time is the process's (gloo's threads too).
        cpu_of = time.process_time if wiring[i][2] else cpu_clock
        cpu0, start = cpu_of(), clock()
        if item == stall:
            _stall(item)
        if item == fail:
            raise RuntimeError(f"injected failure in {item} (the _inject test hook)")
        for part, out in _run_parts(state, wiring[i], arrived, log, inside):
            # The compute ends here, before any send is posted: a posted send can reach a
            # waiting receiver at once, and a clock read after posting could fall after the
            # receiver's start (a preempted sender), putting a consumer "before" its producer.
            end = clock()
            if out is None:
                continue
            readers = step.keep.get(part)
            if readers:
                state.local[part] = [out, readers]
            if part != drop:
                for transfer in step.send:
                    if transfer.producer == part:
                        p2p.send(transfer, out, pending, link)
                        state.meter.hold_send(out.numel() * out.element_size())
                        sends.append((part, item, transfer.dst, end, clock()))
        if item == lag:                # test hook: the sender preempted once its sends are out
            time.sleep(0.1)
        cpu = cpu_of() - cpu0          # posting the sends is this action's work: the replay pays it
        actions.append((i, item, waited_from, start, end, cpu, meter.live))
        peaks.append(meter.peak)
        memory.append((end, state.meter.live))
        if reductions:
            _note_reductions(reductions, actions, clock)
    board.set(rank, k, len(plan), SENDS)
    p2p.wait_all(pending)
    state.meter.sends_done()
    for red in reductions:            # the gradients must be summed before the optimizer
        board.set(rank, k, actions[red.entry][0], RUN, IN_REDUCTION)
        red.finish()
        _finished(red, actions, clock)
    reductions.clear()
    return {"begin": begin, "actions": actions, "recvs": recvs, "sends": sends,
            "memory": memory,
            "losses": dict(state.losses), "peak": max(peaks, default=meter.peak),
            "action_peaks": peaks, "inside": inside,
            "send_peak": state.meter.sending_peak, "offloaded_peak": meter.offloaded_peak}


def _run_parts(state: StepState, wires, arrived: dict, log: list, inside: list):
    """Run a step's parts, yielding (part, output) as each finishes: one after the other, or,
    for a braided step, side by side — each part's braided handler (a generator) is resumed in
    turn, so one part computes while another's asynchronous all-reduce is in flight. The spans
    each part's code timed into `log` (a tensor-parallel all-reduce) go to `inside`, as
    (part, start, end, what)."""
    _shapes, parts, braided = wires
    runners = []
    meter = state.meter
    for part, run, sources, braid in parts:
        inputs = {name: arrived.pop(key) if where == "recv" else state.take_local(key)
                  for name, (where, key) in sources}
        if not braided:                 # (a braided run hooks every forward: sampling.py)
            logged = len(log)
            meter.begin(part)           # the sampled meter records or replays the part
            out = run(state, part, inputs)
            meter.end()
            inside += [(part, *entry) for entry in log[logged:]]
            yield part, out
            continue
        runners.append((part, (braid or _whole(run))(state, part, inputs)))
    while runners:
        for entry in list(runners):
            part, gen = entry
            logged = len(log)
            try:
                next(gen)
                finished, out = False, None
            except StopIteration as stop:
                finished, out = True, stop.value
            inside += [(part, *entry) for entry in log[logged:]]
            if finished:
                runners.remove(entry)
                yield part, out


def _whole(run):
    """A handler with no braided version, as one: it runs whole at its first turn."""
    def braid(state, part, inputs):
        return run(state, part, inputs)
        yield                                   # (makes this a generator function)
    return braid


def _note_reductions(reductions, actions, clock) -> None:
    """Tie reductions just launched to their step's record; note the ones completed."""
    for red in reductions:
        if red.entry is None:
            red.entry = len(actions) - 1
        elif red.finished is None and red.done():
            _finished(red, actions, clock)


def _finished(red, actions, clock) -> None:
    """A reduction's record spans launch to completion (on the rank's communication lane);
    its 'CPU time' is that wall time: the replay charges it as it was measured."""
    if red.finished is None:
        red.finished = clock()
    i, item, waited, start, _end, _cpu, live = actions[red.entry]
    actions[red.entry] = (i, item, waited, start, red.finished, red.finished - start, live)


def _post(step, wires, link=None) -> list:
    shapes = wires[0]
    return [p2p.post_recv(t, shape, dtype, link) for t, (shape, dtype) in zip(step.recv, shapes)]
