"""RunResult: what a pipeline run measured, replayed and proved, assembled from the rank reports."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import torch

from ..schedules.kinds import ACTIVATION, INPUT_GRAD, KIND_SPECS, SAVED
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..sim.timeline import Event, Timeline
from ..schedules.actions import Action
from .collectives import ALL_REDUCE
from .spec import RunSpec
from .techniques import assemble_all, priced_kinds, walk
from ..model.memory import _blocks
from ..schedules.reductions import REPLICA_SUM
from ..schedules.routes import replicas


@dataclass
class RunResult:
    """Timelines of the last training step; losses and gradient check of the first.

    `timeline` is measured wall-clock time; `replay` re-runs the schedule in the simulator with
    each action's measured CPU time (what p dedicated cores would show; with `steps` > 1 the
    smallest of its steps' readings, the one other processes inflated least); `simulated` uses one
    median cost per stage and kind (the textbook model). The first step is the one compared with
    the unsplit model, because every later step starts from weights that already went through
    two different (equally valid) float orders.
    """
    spec: RunSpec
    timeline: Timeline
    replay: Timeline
    simulated: Timeline
    losses: list[float]                 # per microbatch of the first step (each a mean loss)
    loss: float                         # their mean: the batch's mean loss
    loss_history: list[float]           # the batch loss of every step
    comm_latency: float                 # median measured one-way message latency, seconds
    recv_wait: dict[int, float]         # seconds each rank spent blocked in receives
    reference_loss: float | None = None
    max_grad_error: float | None = None
    grad_errors: dict[str, float] = field(default_factory=dict)
    timelines: list[Timeline] = field(default_factory=list)   # measured, one per step
    send_buffer_peak: dict[int, int] = field(default_factory=dict)   # bytes held by posted sends
    # Activation offload (kinds Off, Re): per pipeline rank, the most bytes of saved activations
    # held off the device at once; counted apart from the activations (they left the meter).
    offloaded_bytes: dict[int, int] = field(default_factory=dict)
    i_frees: float | None = None        # measured share of a forward's activations an I frees
    wall_time: float = 0.0              # seconds the caller waited for the run
    # A mesh of pp × dp processes: `timeline` is replica 0's pipeline; every replica's, on one
    # time origin, is in `replica_timelines[dp]`, and each process's alone (its events on its
    # pipeline rank's row) in `process_timelines[(pp, dp)]` — the last step of each.
    replica_timelines: list[Timeline] = field(default_factory=list)
    process_timelines: dict[tuple[int, int], Timeline] = field(default_factory=dict)
    # A schedule with optimizer updates (U): weight versions and their check (techniques/async_versions.py).
    versions: object | None = None
    # Per pipeline rank, each action of the last step with the peak of live activation bytes
    # while it ran (what it materialised included, even if it freed it by its end).
    action_peaks: dict[int, list[tuple[Action, int]]] = field(default_factory=dict)
    # Bytes of weights each pipeline rank built (replica 0): twice a rank's share where every
    # stage has a weight replica (DualPipe, Chimera).
    rank_parameter_bytes: dict[int, int] = field(default_factory=dict)
    # Tensor parallelism: per pipeline rank (shard 0 of replica 0), the last step's all-reduces
    # as (pass, start, end, "forward" / "backward" / "forward, async"), seconds from its start.
    tp_all_reduces: dict[int, list] = field(default_factory=dict)
    # MoE models: per step, tokens each expert was sent and dropped, per microbatch and layer
    routing: list = field(default_factory=list)
    # The machine's 1-minute load average when the run was sent and when it came back: a
    # measured (wall-clock) figure means little without it on a shared machine.
    load: tuple[float, float] | None = None
    # The technique hooks the run entered (runtime/techniques.py), as (phase, technique): under
    # -1 the parent's (prepare, assemble), under each process rank its own (setup, step).
    walk: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    # Per process, how its activation meter counted: "sampled: 0F0 hooked" (the forwards it
    # hooked, the others counted from them) or "full: <why every forward was hooked>"
    meter: dict[int, str] = field(default_factory=dict)
    # Why the run does not match its unsplit model (empty: it does, or was not checked):
    # runtime/exactness.py; the table says NOT EXACT with them.
    inexact: list[str] = field(default_factory=list)

    @property
    def load_line(self) -> str:
        """"measured at load average 2.31 → 2.40 on 2 cores" (what every live figure needs)."""
        import os
        if self.load is None:
            return "load average not recorded"
        before, after = self.load
        return f"measured at load average {before:.2f} → {after:.2f} on {os.cpu_count()} cores"

    @property
    def mesh(self):
        return self.spec.mesh

    @property
    def data_parallel(self) -> int:
        return self.spec.data_parallel

    @property
    def parameter_bytes(self) -> dict[int, int]:
        """{pipeline rank: bytes of the weights it built}, as the workers counted them (twice a
        rank's share where its stages have weight replicas, as in DualPipe and Chimera)."""
        return self.rank_parameter_bytes

    def stage_parameter_bytes(self) -> list[int]:
        """Bytes of float32 parameters of each stage (also what its gradient all-reduce moves),
        from the byte model."""
        return [self.spec.model.parameter_bytes(a, b) for a, b in self.spec.bounds]

    def predicted(self, bandwidth: float, latency: float = 0.0) -> Timeline:
        """The simulator's prediction for this run: each compute kind at its measured median
        (as `simulated`), each gradient all-reduce costed by the ring formula over the run's
        replicas, 2(n−1)·`latency` + 2(n−1)/n · parameter bytes / `bandwidth`, on its lane."""
        from dataclasses import replace
        fitted = Costs.fit(self.timeline, self.schedule.stages, self.comm_latency)
        # the measured all-reduce is dropped from the fit: the ring formula costs it instead
        costs = replace(fitted, kinds={k: v for k, v in fitted.kinds.items() if k != ALL_REDUCE},
                        bandwidth=bandwidth, latency=latency,
                        parameter_bytes=self.stage_parameter_bytes(), replicas=self.data_parallel)
        tl = simulate(self.schedule, costs, source="simulated",
                                 i_frees=freed_share(self.i_frees))
        tl.title = f"{self.schedule.name}, all-reduce at {bandwidth / 1e9:.3g} GB/s"
        return tl

    def reduction_transfer(self) -> dict[int, float]:
        """Per stage, the all-reduce's own time: from the moment the *last* replica launched it
        (before that, the others only wait for it) to completion, the median over replicas. This
        is what the ring formula 2(n−1)·latency + 2(n−1)/n · bytes / bandwidth predicts; the
        spans in `reduction_times()` also hold the wait for the slowest replica."""
        out = {}
        for stage in range(self.schedule.stages):
            events = [e for (pp, _dp), tl in self.process_timelines.items()
                      for e in tl.comm_events() if e.action.stage == stage]
            if events:
                last = max(e.start for e in events)
                out[stage] = statistics.median(max(e.end - last, 0.0) for e in events)
        return out

    def _mesh_lines(self) -> str:
        mesh, times = self.mesh, self.reduction_times()
        overlap = self.timeline.reduction_overlap()
        cells = ", ".join(f"pp {p} / dp {d}: " + " ".join(f"{s}AR {t * 1e3:.2f} ms"
                                                         for s, t in sorted(times[(p, d)].items()))
                          for d in range(mesh.dp) for p in range(mesh.pp))
        return (f"mesh {mesh.pp} pipeline ranks × {mesh.dp} data-parallel replicas = "
                f"{mesh.size} processes; gradient all-reduce (measured) {cells}; "
                f"{overlap['hidden_share']:.0%} of replica 0's hidden behind compute")

    def reduction_times(self) -> dict[tuple[int, int], dict]:
        """Per process (pp, dp): {stage: measured seconds of its gradient all-reduce}."""
        out = {}
        for coords, tl in self.process_timelines.items():
            out[coords] = {e.action.stage: e.duration for e in tl.comm_events()}
        return out

    @property
    def schedule(self):
        return self.spec.schedule

    @property
    def memory(self) -> dict[int, list[tuple[float, float]]]:
        """Live activation bytes per rank over the last step: [(seconds, bytes)]."""
        return self.timeline.memory

    @property
    def peak_activations(self) -> dict[int, float]:
        """Peak live activation bytes per rank in the last step: the highest of its actions'
        own peaks (the meter samples inside each action, not only at its end)."""
        if not self.action_peaks:
            return self.timeline.peak_activations()
        return {r: max((peak for _a, peak in self.action_peaks.get(r, ())), default=0)
                for r in range(self.schedule.ranks)}

    def summary(self) -> dict:
        return {"schedule": self.schedule.name, "ranks": self.schedule.ranks,
                "microbatches": self.schedule.microbatches,
                "makespan": {t.source: t.makespan for t in self._views()},
                "bubble_fraction": {t.source: t.bubble_fraction() for t in self._views()},
                "loss": self.loss, "reference_loss": self.reference_loss,
                "max_grad_error": self.max_grad_error, "loss_history": self.loss_history,
                "peak_activation_bytes": self.peak_activations, "recv_wait": self.recv_wait,
                "send_buffer_peak": self.send_buffer_peak,
                "comm_latency": self.comm_latency, "wall_time": self.wall_time,
                "load": self.load}

    def _views(self) -> list[Timeline]:
        return [self.timeline, self.replay, self.simulated]

    def table(self) -> str:
        s, spec = self.schedule, self.spec
        stages = " ".join(f"[{a},{b})" for a, b in spec.bounds)
        lines = [f"{s.name}: {_count(s.ranks, 'rank', 'ranks')}, "
                 f"{_count(s.microbatches, 'microbatch', 'microbatches')}, stages {stages} "
                 f"({spec.partition_name}), batch {spec.batch_size} "
                 f"({spec.rows_per_microbatch} rows per microbatch), {_count(spec.steps, 'step', 'steps')}"
                 + (", run by torch's _PipelineScheduleRuntime (no activation meter)"
                    if spec.engine == "torch" else ""),
                 f"{'':22}{'measured':>11}{'replayed':>11}{'simulated':>11}",
                 f"{'makespan (ms)':22}" + "".join(f"{t.makespan * 1e3:11.2f}" for t in self._views()),
                 f"{'bubble fraction':22}" + "".join(f"{t.bubble_fraction():11.3f}" for t in self._views())]
        which = " (step 1)" if spec.steps > 1 else ""
        if self.reference_loss is not None:
            rel = abs(self.loss - self.reference_loss) / max(abs(self.reference_loss), 1e-12)
            lines.append(f"loss{which} {self.loss:.6f}  reference {self.reference_loss:.6f}  "
                         f"(relative difference {rel:.1e})")
            lines.append(f"max grad error {self.max_grad_error:.1e} (relative, vs the unsplit model)")
        else:
            lines.append(f"loss{which} {self.loss:.6f} (no reference check)")
        lines.extend(f"NOT EXACT: {why}" for why in self.inexact)
        if "W" in s.kinds() and hasattr(spec.cfg, "deferred_share"):   # a custom model's W
            share, fused = spec.cfg.deferred_share()
            lines.append(f"W (deferred weight gradients): {share:.0%} of the parameters (its "
                         f"nn.Linear layers'); the rest come with I" +
                         (f" ({'; '.join(fused[:3])}{'; ...' if len(fused) > 3 else ''})"
                          if fused and share < 1 else ""))
        if len(self.loss_history) > 1:
            lines.append(f"loss history, step 1 -> step {spec.steps}: "
                         f"{self.loss_history[0]:.4f} -> {self.loss_history[-1]:.4f}")
        ranks = range(s.ranks)
        lines.append(f"{'rank':22}" + "".join(f"{r:>11}" for r in ranks))
        lines.append(f"{'peak activations (MiB)':22}" +
                     "".join(f"{self.peak_activations[r] / 2**20:11.3f}" for r in ranks))
        busy = self.timeline.busy()
        lines.append(f"{'busy (ms)':22}" + "".join(f"{busy[r] * 1e3:11.2f}" for r in ranks))
        lines.append(f"{'peak send buffers (MiB)':22}" +
                     "".join(f"{self.send_buffer_peak.get(r, 0) / 2**20:11.3f}" for r in ranks))
        if any(self.offloaded_bytes.values()):
            lines.append(f"{'peak offloaded (MiB)':22}" +
                         "".join(f"{self.offloaded_bytes.get(r, 0) / 2**20:11.3f}" for r in ranks))
        lines.append(f"{'waiting in recv (ms)':22}" +
                     "".join(f"{self.recv_wait[r] * 1e3:11.2f}" for r in ranks))
        if spec.data_parallel > 1:
            lines.append(self._mesh_lines())
        lines.append(f"message latency {self.comm_latency * 1e6:.0f} us (median, measured); "
                     f"the whole run took {self.wall_time:.3f} s as seen by the caller "
                     f"(commands, all steps, results)")
        lines.append(self.load_line)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _measured(spec: RunSpec, reports: list[dict], k: int, t0: float | None = None) -> Timeline:
    if t0 is None:
        t0 = min(rep["steps"][k]["begin"] for rep in reports)
    events, memory = [], {}
    for rep in reports:
        step = rep["steps"][k]
        events += [Event(rep["rank"], a, start - t0, end - t0, cpu)
                   for _i, a, _w, start, end, cpu, _mem in step["actions"]]
        # spans recorded inside actions (an expert all-to-all, a tensor-parallel all-reduce),
        # on the communication lane
        events += [Event(rep["rank"], a, start - t0, end - t0, cpu)
                   for a, start, end, cpu in step.get("events", ())]
        memory[rep["rank"]] = [(t - t0, level) for t, level in step["memory"]]
    return Timeline(events, spec.schedule.ranks, source="measured", memory=memory,
                    memory_unit="bytes", title=spec.schedule.name, schedule=spec.schedule)


def _collectives_own_time(reports: list[dict]) -> None:
    """A collective's CPU figure becomes its own time: from the moment its *last* member
    launched it to its end on each rank. (Its measured span also holds the wait for the other
    members, which the replay and the cost fit must not charge twice: the simulator already
    starts a collective when every member has reached it.) Start and end are left as measured."""
    for k in range(len(reports[0]["steps"])):
        latest: dict = {}
        for rep in reports:
            for _i, item, _w, start, _e, _c, _m in rep["steps"][k]["actions"]:
                if KIND_SPECS[item.parts[0].kind].collective:
                    latest[item] = max(latest.get(item, start), start)
        if not latest:
            continue
        for rep in reports:
            rep["steps"][k]["actions"] = [
                (i, item, w, start, end, max(end - latest[item], 0.0) if item in latest else cpu, mem)
                for i, item, w, start, end, cpu, mem in rep["steps"][k]["actions"]]


def replay_costs(reports: list[dict]) -> dict:
    """Each action's cost for the replay: its smallest CPU time over the run's steps.

    Other processes on the machine only ever add to an action's CPU time (they evict its cache,
    share its core's pipeline, lower the clock), so the smallest reading of the same action is
    the least inflated one; with one step it is that step's reading."""
    cpu: dict = {}
    for rep in reports:
        for step in rep["steps"]:
            for _i, action, _w, _s, _e, c, _m in step["actions"]:
                cpu[action] = min(c, cpu.get(action, c))
    return cpu


def _latency(reports: list[dict], k: int) -> float:
    """Median time from a producer's end to the arrival at a receiver that was already waiting."""
    ended = {part: end for rep in reports for _i, item, _w, _s, end, _c, _m in rep["steps"][k]["actions"]
             for part in item.parts}
    # A part of a compound action may send before the action ends: its own compute end counts.
    ended.update({part: done for rep in reports
                  for part, _item, _dst, done, _posted in rep["steps"][k].get("sends", ())})
    waited, all_ = [], []
    for rep in reports:
        for producer, _consumer, _src, t_wait, t_arrive in rep["steps"][k]["recvs"]:
            latency = t_arrive - max(t_wait, ended[producer])
            all_.append(max(latency, 0.0))
            if t_wait < ended[producer]:
                waited.append(max(latency, 0.0))
    pool = waited or all_
    return statistics.median(pool) if pool else 0.0


def _i_frees(reports: list[dict], k: int) -> float | None:
    """The share of a forward's activation bytes that its I releases (W releases the rest),
    measured with the saved-tensors meter: the median over the step's split backwards of the
    bytes I freed over the bytes F added (and a recomputation R restored: every kind whose
    output is the stage's activations or its saved ones). None when no backward is split."""
    adds = {k for k, spec in KIND_SPECS.items() if spec.output in (ACTIVATION, SAVED)}
    added, shares = {}, []
    for rep in reports:
        before = rep["steps"][k]["memory"][0][1]
        for _i, item, _w, _s, _e, _c, live in rep["steps"][k]["actions"]:
            if len(item.parts) == 1 and item.kind in adds:
                key = (item.stage, item.microbatch)
                added[key] = added.get(key, 0) + live - before
            elif len(item.parts) == 1 and KIND_SPECS[item.kind].role == INPUT_GRAD:
                grew = added.get((item.stage, item.microbatch))
                if grew:
                    shares.append((before - live) / grew)
            before = live
    return statistics.median(shares) if shares else None


def freed_share(i_frees: float | None) -> float:
    """The measured share an I frees, as the simulator takes it (0..1). A stack whose Linears
    hold more than its other saved tensors (a small MLP) grows during I — the (x, dy) pairs it
    keeps for W outweigh what it frees — and is simulated as freeing nothing."""
    return 0.0 if i_frees is None else min(max(i_frees, 0.0), 1.0)


def _on_link(spec: RunSpec, fitted: Costs, reports: list[dict]) -> Costs:
    """The fitted compute costs with the communication priced by the run's link, as the
    runtime waited it out: each message crossing ranks α + bytes/β (the stage boundary's
    activation), each gradient all-reduce or replica sum the ring formula over the bytes the
    workers reduced, and under tensor parallelism each forward and input-gradient pass its
    2 all-reduces per block of one activation (T_AR); an expert all-to-all inside a pass adds
    its link time to the pass (the median over its microbatches). The measured spans of those
    collectives are dropped from the table: the formula prices them instead. `reports`: one
    process per pipeline rank (replica 0, shard 0)."""
    link, mesh = spec.link, spec.mesh
    # the formulas price these: the gradient sums, and what the techniques say they price
    priced = {ALL_REDUCE, REPLICA_SUM} | priced_kinds(spec.techniques)
    message = spec.message_bytes()
    reduced: dict[int, int] = {}
    inside: dict[tuple[str, int], list[float]] = {}     # (kind, stage) -> all-to-all seconds
    for rep in reports:
        reduced.update(rep["reduced_bytes"])
        for part, seconds in rep["steps"][-1].get("link_waits", {}).items():
            inside.setdefault((part.kind, part.stage), []).append(seconds)
    stages = spec.schedule.stages
    passes = {}
    for kind in sorted({kind for kind, _s in inside}):
        extra = [statistics.median(inside.get((kind, s), [0.0])) for s in range(stages)]
        table = getattr(fitted, kind) if kind in ("F", "I", "W", "B") else fitted.kinds[kind]
        table = table if isinstance(table, list) else [table] * stages
        passes[kind] = [t + x for t, x in zip(table, extra)]
    kinds = {k: v for k, v in fitted.kinds.items() if k not in priced}
    kinds.update({k: v for k, v in passes.items() if k not in ("F", "I", "W", "B")})
    fitted = replace(fitted, **{k: v for k, v in passes.items() if k in ("F", "I", "W", "B")})
    tp_allreduce = [2 * _blocks(spec.cfg, a, b) * link.allreduce_time(message, mesh.tp)
                    for a, b in spec.bounds] if mesh.tp > 1 else 0.0
    return replace(fitted, comm=0.0, link=link, message_bytes=float(message),
                   kinds=kinds, parameter_bytes=[float(reduced.get(s, 0)) for s in range(stages)],
                   tp_allreduce=tp_allreduce)


def reference_check(spec: RunSpec, grads: dict) -> tuple[float, float, dict]:
    """Loss and gradients of the unsplit model on the first batch; max relative grad error
    (over every copy of a parameter: `grads[name]` is a tensor, or a list of the copies that
    weight replicas hold)."""
    loss, reference = spec.model.reference(spec.batch_size, spec.seed)
    errors = {}
    for name, ref in reference.items():
        copies = grads.get(name)
        if isinstance(copies, torch.Tensor):
            copies = [copies]                 # one copy, given as the tensor itself
        if copies is None or not len(copies):
            raise RuntimeError(f"no rank returned a gradient for {name}")
        scale = max(ref.abs().max().item(), 1e-12)
        errors[name] = max(((got - ref).abs().max() / scale).item() for got in copies)
    return loss, max(errors.values()), errors


def _replicated_layers(spec: RunSpec) -> set[int]:
    """Indices of the layers that weight replicas (routes.py) hold twice."""
    return {layer for stages in replicas(spec.schedule).values()
            for layer in range(*spec.bounds[stages[0]])}


@dataclass
class Assembly:
    """The run's reports as the techniques' assemble hooks see them (techniques.py)."""
    spec: RunSpec
    reports: list[dict]                 # replica 0's processes, as pipeline ranks 0..pp-1
    replicas: list[list[dict]]          # the same per replica
    every: list[dict]                   # every process's report, by process rank
    result: RunResult
    t0: float                           # the last step's time origin
    last: int                           # the last step's index
    merge: object = None                # shards' gradient dicts -> the whole rank's

    def __post_init__(self) -> None:
        if self.merge is None:
            self.merge = _one_shard


def _one_shard(shards: list[dict]) -> dict:
    if len(shards) != 1:
        raise RuntimeError("several shards per pipeline rank, but no technique merges them")
    return shards[0]


def assemble(spec: RunSpec, reports: list[dict], wall_time: float = 0.0) -> RunResult:
    """Build the RunResult from every rank's report (sorted by rank)."""
    reports = sorted(reports, key=lambda rep: rep["rank"])
    every = reports
    mesh, sched, last = spec.mesh, spec.schedule, len(reports[0]["steps"]) - 1
    # Per replica, its processes as pipeline ranks 0..pp-1 (the view every metric reads).
    replicas = [[dict(reports[mesh.rank(p, d)], rank=p) for p in range(mesh.pp)]
                for d in range(mesh.dp)]
    reports = replicas[0]
    _collectives_own_time(reports)
    # The ranks computing a loss: one per route end (two routes: both ends of the pipeline).
    ends = sorted({sched.rank_of(s) for s in sched.loss_stages()})
    loss_ranks = [replica[r] for replica in replicas for r in ends]
    history = [sum(sum(lr["steps"][k]["losses"].values()) for lr in loss_ranks)
               / (sched.microbatches * mesh.dp) for k in range(last + 1)]
    first = [{mb: loss for r in ends for mb, loss in replica[r]["steps"][0]["losses"].items()}[mb]
             for replica in replicas for mb in range(sched.microbatches)]
    timelines = [_measured(spec, reports, k) for k in range(last + 1)]
    t0 = min(rep["steps"][last]["begin"] for replica in replicas for rep in replica)
    replica_timelines = [_measured(spec, replica, last, t0) for replica in replicas]
    process_timelines = {}
    for d, replica in enumerate(replicas):
        for p, rep in enumerate(replica):
            whole = replica_timelines[d]
            process_timelines[(p, d)] = Timeline(
                whole.events_of(p), sched.ranks, source="measured",
                memory={p: whole.memory.get(p, [])}, memory_unit="bytes",
                title=f"{sched.name}: pp {p} / dp {d}", schedule=sched)
    cpu = replay_costs(reports)
    comm = _latency(reports, last)
    i_frees = _i_frees(reports, last)
    fitted = Costs.fit(timelines[-1], sched.stages, comm)
    replayed = Costs(per_action=cpu, comm=comm, unit="s")
    if spec.link is not None:
        # Both price communication by the link; the replay keeps each action's CPU time (a
        # compound's parts take their share from the fit, the link's all-reduces around them).
        fitted = _on_link(spec, fitted, reports)
        replayed = replace(fitted, per_action=cpu)
    replay = simulate(sched, replayed, source="replayed",
                                 i_frees=freed_share(i_frees))
    modelled = simulate(sched, fitted, source="simulated",
                                   i_frees=freed_share(i_frees))
    wait = {rep["rank"]: sum(start - w for _i, _a, w, start, _e, _c, _m in rep["steps"][last]["actions"])
            for rep in reports}
    result = RunResult(spec, timelines[-1], replay, modelled,
                       losses=first,
                       loss=history[0], loss_history=history, comm_latency=comm,
                       recv_wait=wait, timelines=timelines, wall_time=wall_time,
                       send_buffer_peak={rep["rank"]: rep["steps"][last]["send_peak"]
                                         for rep in reports},
                       offloaded_bytes={rep["rank"]: rep["steps"][last].get("offloaded_peak", 0)
                                        for rep in reports},
                       i_frees=i_frees, replica_timelines=replica_timelines,
                       process_timelines=process_timelines,
                       action_peaks={rep["rank"]: [(a[1], peak) for a, peak in zip(
                           rep["steps"][last]["actions"], rep["steps"][last]["action_peaks"])]
                           for rep in reports},
                       rank_parameter_bytes={rep["rank"]: rep.get("parameter_bytes", 0)
                                             for rep in reports},
                       load=next((rep["load"] for rep in every if "load" in rep), None))
    assembly = Assembly(spec, reports, replicas, every, result, t0, last)
    assemble_all(spec.techniques, assembly)
    result.walk = {-1: list(walk), **{rep["rank"]: rep.get("walk", []) for rep in every}}
    result.meter = {rep["rank"]: rep.get("meter", "") for rep in every}
    if spec.check and spec.gradient_check:
        # A parameter split over ranks (a vocabulary shard) sums its shards; the copies of a
        # weight replica's part are each checked (after their sum, each must hold the whole
        # batch's gradient). A pipeline rank's shards (tensor parallelism) are put together by
        # the technique's merge; with expert parallelism every replica reports its own experts.
        replicated = _replicated_layers(spec)
        grads: dict = {}
        for p, d in ((p, d) for p in range(mesh.pp) for d in range(mesh.dp)):
            mine = assembly.merge([every[mesh.rank(p, d, t)]["grads"] or {}
                                   for t in range(mesh.tp)])
            for name, g in mine.items():
                if int(name.split(".")[1]) in replicated:
                    grads.setdefault(name, []).append(g)
                else:
                    grads[name] = grads[name] + g if name in grads else g
        result.reference_loss, result.max_grad_error, result.grad_errors = reference_check(spec, grads)
    return result
