"""LocalCluster: a pool of pipeline ranks on this machine, kept alive between runs.

    with pl.LocalCluster(ranks=2) as cluster:
        res = cluster.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=cfg)

Starting the workers costs seconds (each imports torch and joins the gloo group); a warm
`run` costs a fraction of a second, which is what lets a slider re-run a pipeline. A run never
hangs: the caller waits with its own deadline (gloo's timeouts cannot be trusted to be short),
watching a progress board the ranks write to; on a timeout, an exception in a worker, a dead
worker or Ctrl-C, every worker is killed and reaped, and the next run starts fresh ones.
"""
from __future__ import annotations

import atexit
import time
import weakref

from ..checks import MAX_LOCAL_RANKS, at_most, boolean, check_steps, positive_int
from ..schedules import comm_plan
from ..sim.link import check_link_time
from ..sim.partition import partition_for_run
from .board import DONE, OPTIM, POLL, RECV, RUN, SENDS, SETUP, SYNC
from .calls import CallResults, call_all, pack_call, target_name
from .errors import WorkerError
from .exactness import judge, warn_before
from .pool import WorkerPool, death
from .result import RunResult, assemble
from .spec import check_timeout, prepare_run
from .meshwatch import diagnose_mesh
from .watchdog import diagnose, is_stopped, stalled
from ..support import noise     # read at call time: a test can stand in for the load reading
from ..support.threads import one_thread

_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()
DEATH_GRACE = 0.5      # seconds to let a killed worker's exit show before blaming a survivor


@atexit.register
def _close_all() -> None:
    for cluster in list(_LIVE):
        cluster.close()


class LocalCluster:
    """`ranks` spawned worker processes, one thread each, pinned to cores when `pin`.

    `timeout` is how long (seconds, at least 1: spec.MIN_TIMEOUT) the pipeline may go with no
    rank making progress before a run raises `PipelineTimeout`; `run(timeout=...)` overrides it
    for one run. The clock starts once every process has set up its stages (set-up may take up
    to watchdog.SETUP_LIMIT, 60 s; a stopped process is named at once). With `start=False` the
    workers start at the first run.
    """

    def __init__(self, ranks: int, timeout: float = 30.0, pin: bool = True, start: bool = True):
        self.ranks = at_most("ranks", positive_int("ranks", ranks), MAX_LOCAL_RANKS,
                             "each rank is a process of its own")
        self.timeout = check_timeout(timeout)
        self.pin = boolean("pin", pin)
        boolean("start", start)
        self._pool: WorkerPool | None = None
        self.starts = 0                    # how many times workers were (re)started
        self.start_time = 0.0              # seconds the last start took
        _LIVE.add(self)
        if start:
            self.start()

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "LocalCluster":
        """Start the workers unless they are running."""
        if self._pool is not None and self._pool.alive():
            return self
        self._discard()
        began = time.perf_counter()
        with noise.StatusLine(delay=0.0) as line:     # seconds of silence otherwise
            if line.enabled:
                line.update(f"starting {self.ranks} worker processes (each imports torch) · "
                            f"load {noise.load_average():.1f}")
            self._pool = WorkerPool(self.ranks, pin=self.pin,
                                    group_timeout=max(600.0, 2 * self.timeout))
        self.start_time = time.perf_counter() - began
        self.starts += 1
        return self

    def close(self) -> None:
        """Stop and reap every worker; the cluster can be started again by `run` or `start`."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()

    def _discard(self) -> None:
        """Kill and reap the workers after a failure (their gloo group is not to be trusted)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.kill()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty when stopped)."""
        return list(self._pool.pids) if self._pool is not None else []

    @property
    def cores(self) -> list[int | None]:
        """The core each worker is pinned to (None: not pinned)."""
        return list(self._pool.cores) if self._pool is not None else []

    def __repr__(self) -> str:
        state = "running" if self._pool is not None and self._pool.alive() else "stopped"
        return (f"LocalCluster(ranks={self.ranks}, {state}, pids={self.pids}, "
                f"cores={self.cores}, timeout={self.timeout:g})")

    # --- runs -----------------------------------------------------------------------------------
    # While workers run (and while the parent checks their gradients) the parent keeps one torch
    # thread: a second one competes with them for the cores (05's live cell took 2.3x as long in
    # a kernel left at torch's default). Restored after, for the kernel's own computations.
    @one_thread()
    def run(self, schedule, model=None, partition=None, *, seed: int = 0,
            batch_size: int | None = None, steps: int = 1, lr: float = 3e-3,
            timeout: float | None = None, check: bool = True, progress: bool = True,
            data_parallel: int = 1, tensor_parallel: int = 1, recompute=None,
            expert_parallel: int = 1, link=None, engine: str = "pipelab", torch_trace=None,
            _inject: dict | None = None, _meter: str = "sampled") -> RunResult:
        """Run `schedule` on the workers and return what was measured.

        model: a pl.ModelConfig (default ModelConfig()), or a pl.CustomModel (your layers,
            loss and batches, named 'module:function'); every rank builds its stages from it.
            A custom model runs every schedule of forwards and backwards (ZB's I/W split on
            its nn.Linear layers), data parallelism, recomputation (a stage's layers re-run
            from its input), `steps=` and the exactness check against its unsplit stack; what
            needs the GPT's inside (tensor, expert and vocabulary parallelism, updates inside
            the schedule) is refused. Checked before any worker starts: weights built alike in
            two processes, batches deterministic per seed, a finite mean loss; a run that does
            not match its unsplit stack warns (InexactRunWarning) and says NOT EXACT in its table.
        partition: a pl.Partition, a method ("uniform", "params", "cost"), a layout such as
            "E|t*3|t*3|L" (a custom model's: layer ranges "0-2|3-5"), or a list of (start,
            stop) layer ranges; default uniform. A custom model is split as
            pl.partition(model, stages, method, batch_size=rows per microbatch) splits it.
        seed: seeds the batches (weights come from model.seed); every rank draws the same ones.
        batch_size: rows per step, a multiple of the microbatch count (default 2 per microbatch).
        steps, lr: train for `steps` AdamW steps; `loss_history` matches single-process training.
        check: compare the first step's loss and gradients with the unsplit model.
        data_parallel: replicas of the pipeline (a mesh of ranks = pipeline ranks × replicas
            processes); each takes 1/data_parallel of the batch, and each stage's gradients are
            all-reduced over its replicas right after its last backward (`AR` actions).
        recompute: activation recomputation, "none" (default), "full", "selective" or
            "every-k", or {"policy": "every-k", "k": 2}, or a list with one per stage; `R`
            actions are added before each backward that needs one (recompute.py).
        tensor_parallel: shards of each pipeline rank (Megatron tensor parallelism,
            techniques/tensor.py): every block is split over that many processes, which sum
            activations and input gradients with all-reduces (`Tp` events on the timeline).
        expert_parallel: divide each MoE layer's experts over the data-parallel group (a mesh
            of pipeline ranks × expert_parallel processes; techniques/expert.py).
        link: a pl.Link(latency=seconds, bandwidth=bytes_per_s): every message completes no
            earlier than latency + bytes / bandwidth after it was posted, every all-reduce by
            the ring formula, every all-to-all likewise; the ranks sleep through the wait (no
            core is used, no CPU time charged), and `res.simulated` prices the same link.
        engine: "pipelab" (default, our executor) or "torch": the schedule, exported with
            `to_torch_csv`, runs on torch.distributed.pipelining's `_PipelineScheduleRuntime`
            in the same workers (runtime/torch_engine.py), checked against the unsplit model
            and timed per action alike; our techniques (data/tensor/expert parallelism,
            recompute, link) and schedules torch cannot express are refused before any worker.
        torch_trace: with engine="torch", a directory where each rank writes a torch.profiler
            Chrome trace of its last step, `rank<r>.json` (torch's `PP:<action>` regions).
        _inject: test hook, e.g. {"stall": "1F2"}, {"raise": "1F2"}, {"drop": "0F1"} or
            {"lag": "0F1"} (the rank pauses right after posting that action's sends).
        _meter: "full" hooks every forward with the activation meter instead of one per stage
            (the same figures, at a higher cost: runtime/meter.py); for tests and ablations.
        """
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        check_steps(steps)
        boolean("progress", progress)
        partition = partition_for_run(model, schedule, partition, batch_size, data_parallel)
        spec = prepare_run(schedule, ranks=self.ranks, model=model, partition=partition,
                           seed=seed, batch_size=batch_size, steps=steps, lr=lr, check=check,
                           inject=_inject, data_parallel=data_parallel,
                           tensor_parallel=tensor_parallel, recompute=recompute,
                           expert_parallel=expert_parallel, link=link, _meter=_meter,
                           engine=engine, torch_trace=torch_trace)
        if spec.link is not None:
            check_link_time(spec.link, spec.message_bytes(), spec.data_parallel, timeout)
        warn_before(spec)              # a model that differs by design: said before it runs
        self.start()
        began = time.perf_counter()
        try:
            reports = self._collect(spec, timeout, progress)
        except BaseException:
            self._discard()            # timeout, worker error, death or Ctrl-C: reap everyone
            raise
        result = assemble(spec, reports, wall_time=time.perf_counter() - began)
        judge(result)                  # a failed check is a warning naming the stages
        return result

    @one_thread()                     # as in `run`: the workers get the cores
    def call(self, target, *args, timeout: float | None = None, **kwargs) -> CallResults:
        """Run `target(*args, **kwargs)` on every worker; return the results in rank order (a
        list, `CallResults`, whose `load_line` and repr give the load the call ran at).

        target: 'package.module:function' or a function defined at the top level of an
        importable module (not in a notebook cell or `__main__`: the workers could not import
        it; that is refused here, before any worker moves). torch.distributed is initialised in
        the call. An exception, a death or no answer within `timeout` stops every worker, as a
        failed run does.
        """
        name = target_name(target)
        data = pack_call(name, args, kwargs)
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        self.start()
        pool = self._pool

        def check_deaths(grace: float) -> None:
            _reap(pool, grace)
            pool.check_alive()

        try:
            return call_all(pool, name, data, timeout, check_deaths)
        except BaseException:
            self._discard()
            raise

    def _collect(self, spec, timeout: float, progress: bool) -> list[dict]:
        pool = self._pool
        pool.board.reset()
        sent = pool.board.read()[0].since     # a rank still at this time never got the run
        pool.broadcast("run", spec)
        bar = None
        if progress and spec.steps > 1:
            from tqdm.auto import tqdm   # here, not at import: workers never need IPython
            bar = tqdm(total=spec.steps, desc=f"{spec.schedule.name} steps", leave=False)
        # A transient line from the first second saying where the ranks are (only where someone
        # watches); inside live_compare or paired_rounds it is shown after their count.
        line = noise.Progress(spec.schedule.name, enabled=None if progress and bar is None
                              else False).open()
        load_before = noise.load_average()
        plan = None
        reports: dict[int, dict] = {}
        try:
            while len(reports) < self.ranks:
                if line.enabled:
                    line.detail(_actions(spec, pool.board.read(), reports))
                waiting = [r for r in range(self.ranks) if r not in reports]
                for rank, message in pool.receive(waiting, timeout=POLL):
                    kind = message[0]
                    if kind == "done":
                        reports[rank] = message[2]
                    elif kind == "step" and bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{message[3]:.3f}", refresh=False)
                    elif kind == "error":
                        # A dead peer makes the survivors fail in gloo ("connection closed by
                        # peer"); report the death, the cause, when there is one.
                        self._check_deaths(spec, grace=DEATH_GRACE)
                        raise self._worker_error(rank, message[2], spec)
                self._check_deaths(spec)
                states = pool.board.read()
                now = time.perf_counter()
                # Time out only when no rank has moved for `timeout` (counted after set-up): a
                # rank may legitimately wait a long time for its turn (GPipe's rank 0 waits
                # through fill and drain) while the rest of the pipeline is busy.
                if stalled(states, now, timeout, lambda: _stopped(pool)):
                    plan = plan or comm_plan(spec.schedule)
                    stopped = _stopped(pool)
                    error = diagnose(states, spec.schedule, plan, timeout, now, sent, stopped) \
                        if spec.mesh.size == spec.schedule.ranks else \
                        diagnose_mesh(states, spec, plan, timeout, now, sent, stopped)
                    if error is not None:
                        raise error
        finally:
            line.close()
            if bar is not None:
                bar.close()
        # The load the run saw travels with the reports to the result (RunResult.load).
        reports[0]["load"] = (load_before, noise.load_average())
        return [reports[r] for r in range(self.ranks)]

    def _where(self, rank: int, spec) -> tuple[str, object]:
        """(" while running 1F2 (training step 0)", Action) for an error message: where the
        process was on the progress board."""
        state = self._pool.board.read()[rank]
        acts = spec.schedule.actions[spec.mesh.coords(rank)[0]]
        step = f"(training step {state.step})"
        if state.state in (SENDS, OPTIM):
            return {SENDS: f" after its last action, waiting for its sends {step}",
                    OPTIM: f" in the optimizer step {step}"}[state.state], None
        if state.state == DONE or state.position >= len(acts):
            return "", None
        action = acts[state.position]
        doing = {RUN: f"while running {action}",
                 RECV: f"while waiting for the input of {action}",
                 SETUP: f"while setting up, before its first action {action}",
                 SYNC: f"at the barrier that starts the step, before {action}"}
        return f" {doing.get(state.state, f'before {action}')} {step}", action

    def _worker_error(self, rank: int, text: str, spec) -> WorkerError:
        where, action = self._where(rank, spec)
        last = text.strip().splitlines()[-1] if text.strip() else "an exception"
        return WorkerError(f"{_who(rank, spec)} raised {last}{where}.\nWorker traceback:\n{text}",
                           rank, action, traceback=text)

    def _check_deaths(self, spec, grace: float = 0.0) -> None:
        """Raise WorkerError if a worker has died (waiting up to `grace` s for one to be reaped)."""
        _reap(self._pool, grace)
        try:
            self._pool.check_alive()
        except WorkerError as err:
            where, action = self._where(err.rank, spec)
            raise WorkerError(f"{_who(err.rank, spec)} died: its worker process "
                              f"{death(err.exitcode)}{where}; the other workers were stopped "
                              f"and the next run starts fresh ones", err.rank, action,
                              exitcode=err.exitcode) from None


def _status(spec, states, reports: dict, elapsed: float) -> str:
    """"1f1b: actions 5/16 9/16 done done · 1.2 s · load 2.3": each rank's progress through its
    actions of the current step (or "done"), the time waited and the machine's load."""
    return (f"{spec.schedule.name}: {_actions(spec, states, reports)} · {elapsed:.1f} s · "
            f"load {noise.load_average():.1f}")


def _actions(spec, states, reports: dict) -> str:
    """"actions 5/16 9/16 done (step 2/3)": each rank's progress through its current step."""
    where = []
    for rank, state in enumerate(states):
        if rank in reports or state.state == DONE:
            where.append("done")
        else:
            total = len(spec.schedule.actions[spec.mesh.coords(rank)[0]])
            where.append(f"{min(state.position, total)}/{total}")
    step = max((s.step for s in states), default=0) + 1
    steps = f" (step {step}/{spec.steps})" if spec.steps > 1 else ""
    return f"actions {' '.join(where)}{steps}"


def _reap(pool: WorkerPool, grace: float) -> None:
    """Wait up to `grace` s for a dying worker to be reaped (no wait when grace is 0)."""
    deadline = time.perf_counter() + grace
    while grace and pool.alive() and time.perf_counter() < deadline:
        time.sleep(0.02)


def _stopped(pool: WorkerPool) -> frozenset:
    """The worker processes that are stopped (SIGSTOP, a debugger): watchdog.is_stopped."""
    return frozenset(r for r, pid in enumerate(pool.pids) if is_stopped(pid))


def _who(rank: int, spec) -> str:
    """"rank 1" (the pipeline rank, which is the process on a plain pipeline), or on a mesh
    its coordinates and process index, "pp 1 / dp 0 / tp 1 (process 5)"."""
    if spec.mesh.size == spec.schedule.ranks:
        return f"rank {rank}"
    return f"{spec.mesh.name(rank)} (process {rank})"
