"""The planner: which schedule, mesh, microbatching and recomputation for a model on N devices?

    cal = pl.calibrate(cfg)                                     # measured per-layer costs
    best = pl.plan(cfg, devices=8, memory_per_device=256 * 2**20, calibration=cal).best

`plan` enumerates schedule × pipeline, data, tensor and expert degrees × microbatches × chunks ×
recomputation policy × vocabulary parallelism (the `vocab-1`/`vocab-2` schedules: the
embedding and output layer sharded over the pipeline ranks), predicts each candidate's step
time with the simulator (costs from the calibration, one simulation per candidate; a policy's recomputations are `R` actions placed by
`with_recompute`, as the runtime places them) and its peak memory per rank in bytes with the
byte model (memory.action_bytes) read along the simulated timeline, and ranks them by time.

The mesh axes are pipeline (p), data (dp) and tensor (tp) with p × dp × tp = devices; tp
divides the heads and the MLP's hidden width, and runs without recomputation (as the runtime
does). A tensor shard computes its share of each block and pays two all-reduces a block per
forward and input-gradient pass (`Costs.tp_allreduce`); its bytes are memory.py's with
`tensor=t`. Vocabulary parallelism shards over the pipeline ranks (dp = tp = 1, as the runtime
runs it): its passes are costed from the calibrated head and embedding layers divided over the
shards, its bytes come from memory.py (`vocab_bytes`, `static_bytes`). Expert parallelism
(a mixture-of-experts model) divides the experts over the replicas (ep = dp, where it divides
them): two all-to-alls per block per pass, E/ep experts' bytes, activations bounded by the
experts' capacity (memory_moe.py). The time model is costs.py.
"""
from __future__ import annotations

from itertools import product, repeat
from operator import itemgetter

import numpy as np

from .calibrate import Calibration, calibrate
from ..checks import at_most, names, positive_int, positive_ints
from ..model.memory import action_bytes, static_bytes
from ..model.gpt import ModelConfig
from ..techniques import with_data_parallel
from ..sim.partition import balanced_bounds
from .candidate import CHUNKED, VOCAB, Candidate  # noqa: F401  (pl.Candidate)
from .costs import stage_costs
from ..techniques.recompute import policies, with_recompute
from ..schedules import SCHEDULES, Action, schedule as make_schedule
from ..schedules.gcpause import without_gc
from ..schedules.kinds import byte_rules
from ..sim.simulate import simulate

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "vocab-1",
                  "vocab-2")
POLICIES = ("none", "selective", "full", "every-k")
MiB = 2**20
# The split of each candidate is an exact dynamic program, O(stages × layers²): beyond this
# many layers (4 × the deepest published transformers) a sweep would run for minutes.
MAX_PLAN_LAYERS = 512
MAX_DEVICES = 2**20
MAX_BATCH = 2**24


class Plan(list):
    """Candidates ranked by predicted step time (fastest first), fitting or not."""

    def __init__(self, candidates, calibration: Calibration, devices: int, budget: int,
                 batch_size: int):
        super().__init__(sorted(candidates, key=lambda c: (c.step_time, c.peak_memory)))
        self.calibration, self.cfg = calibration, calibration.cfg
        self.devices, self.budget, self.batch_size = devices, budget, batch_size

    def timeline(self, candidate: Candidate):
        """The simulated step the prediction read (with its all-reduces)."""
        sched = with_data_parallel(candidate.build(), candidate.data_parallel)
        if candidate.recompute != "none":
            sched = with_recompute(sched)
        return simulate(sched, stage_costs(candidate, self.calibration))

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self if c.fits]

    @property
    def best(self) -> Candidate:
        """The fastest candidate that fits; ValueError saying what would be needed if none."""
        fitting = self.fitting
        if not fitting:
            raise ValueError(self.nothing_fits())
        return fitting[0]

    def nothing_fits(self) -> str:
        smallest = min(self, key=lambda c: c.peak_memory)
        return (f"nothing fits in memory_per_device={self.budget / MiB:.1f} MiB on "
                f"{self.devices} device(s): the smallest predicted peak is "
                f"{smallest.peak_memory / MiB:.1f} MiB ({smallest.label()}); give each device "
                f"at least that much, or more devices")

    def frontier(self) -> list[Candidate]:
        """The Pareto frontier of (step time, peak memory): no other candidate is at least as
        fast and as small and better in one. By increasing memory."""
        out: list[Candidate] = []
        for c in sorted(self, key=lambda c: (c.peak_memory, c.step_time)):
            if not out or c.step_time < out[-1].step_time:
                out.append(c)
        return out

    def explain(self) -> str:
        """One sentence on the choice: what it is, and what memory ruled out, if anything."""
        if not self.fitting:
            return self.nothing_fits()
        best, fastest = self.best, self[0]
        head = (f"{best.label()} is predicted fastest of the {len(self.fitting)} of {len(self)} "
                f"candidates that fit ({best.step_time * 1e3:.2f} ms per step, peak "
                f"{best.peak_memory / MiB:.1f} of {self.budget / MiB:.1f} MiB per device)")
        if fastest is best:
            return head + "; memory does not bind: it is the fastest of all."
        return head + (f"; the faster {fastest.label()} ({fastest.step_time * 1e3:.2f} ms) "
                       f"does not fit: {fastest.reason}.")

    def table(self, rows: int = 12) -> str:
        lines = [f"{'rank':>4}  {'candidate':<52} {'ms/step':>8} {'peak MiB':>9}  fits",
                 *(f"{i:>4}  {c.label():<52} {c.step_time * 1e3:8.2f} "
                   f"{c.peak_memory / MiB:9.2f}  {'yes' if c.fits else 'no'}"
                   for i, c in enumerate(self[:rows]))]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Plan({len(self)} candidates, {len(self.fitting)} fit)"

    __str__ = table


@without_gc       # ~10^6 short-lived tuples per sweep, no cycles: collecting them is waste
def plan(cfg: ModelConfig, devices: int, memory_per_device: int, *,
         batch_size: int | None = None, calibration: Calibration | None = None,
         schedules=SCHEDULE_NAMES, recompute=POLICIES, chunks=(2,),
         microbatches=None, optimizer: str = "adamw") -> Plan:
    """Every candidate for training `cfg` on `devices` with `memory_per_device` bytes each,
    predicted and ranked by step time. `batch_size` sequences per step (default 8 per device);
    `microbatches`: the counts to try (default every divisor of a replica's batch);
    `chunks`: stages per rank for the schedules that interleave."""
    schedules, recompute, chunks, microbatches = _check(
        cfg, devices, memory_per_device, schedules, recompute, chunks, microbatches)
    batch_size = 8 * devices if batch_size is None else at_most(
        "batch_size", positive_int("batch_size", batch_size), MAX_BATCH,
        "the planner tries every divisor of a replica's batch")
    cal = calibration if calibration is not None else calibrate(cfg)
    if cal.cfg != cfg:
        raise ValueError("calibration was measured for another model config: calibrate(cfg) again")
    out = []
    for p, dp, tp, ep in _meshes(cfg, devices, batch_size):
        per_replica = batch_size // dp
        tried = microbatches if microbatches is not None else _divisors(per_replica)
        counts = [m for m in tried if per_replica % m == 0]
        for name, m in product(schedules, counts):
            for v in (chunks if name in CHUNKED else (1,)):
                if p * v > cfg.total_layers or (v > 1 and p == 1):
                    continue                     # interleaving needs a pipeline to interleave
                if name in VOCAB and (p == 1 or dp > 1 or tp > 1 or cfg.moe):
                    continue                     # shards over 2+ ranks; the runtime has no dp
                sched = _schedule(name, p, m, v, dp)
                if sched is None:
                    continue                     # the schedule does not exist at this size
                bounds = _bounds(cal, p * v, per_replica // m, name in VOCAB)
                again = None                     # the schedule with its recomputations R
                for policy in (recompute if tp == 1 else ("none",)):   # as the runtime runs
                    c = Candidate(name, p, dp, m, v, policy, per_replica // m, bounds, tp, ep)
                    if policy != "none" and again is None:
                        again = with_recompute(sched).validate()
                    _predict(c, sched if policy == "none" else again, cal, optimizer)
                    c.fits = c.peak_memory <= memory_per_device
                    c.reason = "" if c.fits else _why_not(c, memory_per_device)
                    out.append(c)
    if not out:
        asked = "" if microbatches is None else (
            f" and microbatches={list(microbatches)} (each must divide a replica's "
            f"batch_size / data-parallel degree)")
        raise ValueError(f"no candidate: with batch_size={batch_size}, devices={devices}{asked} "
                         f"no schedule of {list(schedules)} can be built")
    return Plan(out, cal, devices, memory_per_device, batch_size)


def _check(cfg, devices, memory_per_device, schedules, recompute, chunks, microbatches):
    """The arguments, checked and normalised: (schedules, recompute, chunks, microbatches)."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a pl.ModelConfig, got {type(cfg).__name__}")
    at_most("the model's layers (n_layers + 2)", cfg.total_layers, MAX_PLAN_LAYERS,
            "the planner splits every candidate exactly, in O(stages × layers²)")
    at_most("devices", positive_int("devices", devices), MAX_DEVICES,
            "the planner enumerates every divisor of it")
    schedules = names("schedules", schedules, "['1f1b', 'zb-h1']")
    recompute = names("recompute", recompute, "['none', 'full']")
    chunks = positive_ints("chunks", chunks, "(2,) for two stages per rank")
    if microbatches is not None:       # None: every divisor of a replica's batch
        microbatches = positive_ints("microbatches", microbatches, "(4, 8)")
    if isinstance(memory_per_device, bool) or not isinstance(memory_per_device, (int, float)) \
            or not memory_per_device > 0:
        raise ValueError(f"memory_per_device must be a number of bytes > 0, got {memory_per_device!r}")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        raise ValueError(f"schedules: unknown {unknown}; known: {', '.join(SCHEDULES)}")
    bad = [r for r in recompute if r not in POLICIES]
    if bad:
        raise ValueError(f"recompute: policies must be among {POLICIES}, got {bad}")
    return schedules, recompute, chunks, microbatches


def _meshes(cfg: ModelConfig, devices: int, batch_size: int):
    """(pipeline, data-parallel, tensor-parallel, expert-parallel) degrees with p × dp × tp =
    devices, p <= the model's layers, a batch that splits over the replicas, tp dividing the
    heads and the MLP's hidden width (techniques/tensor.py splits by whole heads; not with
    experts, as the runtime runs it), and ep either 1 or, for a mixture of experts whose
    count it divides, the replicas (techniques/expert.py divides the experts over the dp group)."""
    for tp in _divisors(devices):
        if cfg.n_heads % tp or cfg.ffn_width % tp or (tp > 1 and cfg.moe):
            continue
        for p in _divisors(devices // tp):
            dp = devices // tp // p
            if p <= cfg.total_layers and batch_size % dp == 0:
                yield p, dp, tp, 1
                if cfg.moe and dp > 1 and cfg.n_experts % dp == 0:
                    yield p, dp, tp, dp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedule(name: str, p: int, m: int, v: int, dp: int):
    """The validated schedule with its all-reduces, or None where the family has no member
    of this shape (e.g. too few microbatches)."""
    try:
        sched = make_schedule(name, ranks=p, microbatches=m,
                              **({"chunks": v} if name in CHUNKED else {}))
        return with_data_parallel(sched, dp).validate()
    except ValueError:
        return None


def _bounds(cal: Calibration, stages: int, rows: int, vocab: bool = False) -> list[tuple[int, int]]:
    """The contiguous split balancing the calibrated forward + backward time (with the
    vocabulary sharded, the embedding and head weigh nothing: every rank runs a shard)."""
    n = cal.cfg.total_layers
    weights = [0.0 if vocab and i in (0, n - 1) else
               cal.forward_time(i, i + 1, rows) + sum(cal.backward_time(i, i + 1, rows))
               for i in range(n)]
    return balanced_bounds(weights, stages)


def _predict(c: Candidate, sched, cal: Calibration, optimizer: str) -> None:
    cfg = cal.cfg
    tl = simulate(sched, stage_costs(c, cal))
    c.step_time = tl.makespan
    c.static = static_bytes(cfg, c.bounds, sched.stages_of, sched.ranks, optimizer, c.vocab,
                            c.tensor, c.expert)
    table = action_bytes(cfg, c.bounds, c.rows, policies(c.recompute, cfg, c.bounds), c.vocab,
                         c.tensor, c.expert)
    # Each kind's bytes are those of its spec's byte rule.
    c.activation_peak = activation_peaks(tl, {kind: tuple(np.array(table[rule]).T)
                                              for kind, rule in byte_rules().items()
                                              if rule in table})
    c.memory_by_rank = [s + a for s, a in zip(c.static, c.activation_peak)]


def activation_peaks(timeline, table: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[int]:
    """Peak live activation bytes per rank along a timeline, `table[kind] = (added at start,
    released at end)` per stage. At one instant, releases count before additions."""
    parts = [(e[0], part, e[2], e[3]) for e in timeline.events for part in e[1].parts] \
        if set(map(type, map(itemgetter(1), timeline.events))) != {Action} else timeline.events
    n, kinds = len(parts), list(table)
    code = {kind: i for i, kind in enumerate(kinds)}
    action = list(map(itemgetter(1), parts))
    kind = np.fromiter(map(code.get, map(itemgetter(1), action), repeat(-1)), np.int64, n)
    stage = np.fromiter(map(itemgetter(0), action), np.int64, n)
    rank = np.fromiter(map(itemgetter(0), parts), np.int64, n)
    start, end = (np.fromiter(map(itemgetter(i), parts), float, n) for i in (2, 3))
    mine = kind >= 0
    kind, stage, rank, start, end = kind[mine], stage[mine], rank[mine], start[mine], end[mine]
    add = np.array([table[k][0] for k in kinds])[kind, stage]
    release = np.array([table[k][1] for k in kinds])[kind, stage]
    rank, when = np.concatenate((rank, rank)), np.concatenate((start, end))
    delta = np.concatenate((add, -release))
    first = np.concatenate((np.ones(len(add)), np.zeros(len(release))))   # releases first
    sort = np.lexsort((first, when, rank))
    rank, level = rank[sort], np.cumsum(delta[sort])
    peaks = [0] * timeline.ranks
    bounds = np.searchsorted(rank, np.arange(timeline.ranks + 1))
    for r in range(timeline.ranks):
        a, b = bounds[r], bounds[r + 1]
        if b > a:                        # the level before this rank's first change is a's
            peaks[r] = int(max(0, (level[a:b] - (level[a - 1] if a else 0)).max()))
    return peaks


def _why_not(c: Candidate, budget: int) -> str:
    r = int(np.argmax(c.memory_by_rank))
    return (f"rank {r} would hold {c.memory_by_rank[r] / MiB:.1f} MiB > {budget / MiB:.1f} MiB "
            f"({c.activation_peak[r] / MiB:.1f} MiB of activations, {c.static[r] / MiB:.1f} MiB "
            f"of parameters, gradients and optimizer state)")
