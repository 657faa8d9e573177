"""Measured per-layer costs: what the planner (plan.py) times its candidates with.

`calibrate(cfg)` times each layer's forward and backward alone, on one thread, at two
microbatch sizes, and fits a line per layer: seconds = fixed + per_row × rows. The fixed part
matters at toy sizes (Python and kernel launch overhead); the per-row part at real ones. The
backward is split into its input-gradient (I) and weight-gradient (W) passes by their matmul
FLOPs: every Linear's two gradient matmuls cost the same, attention's QKᵀ and weighted sum
have no weights (all I), the embedding's backward is all W.

Message latency and all-reduce bandwidth are not per layer: they are arguments (defaults are
loopback gloo on these machines), or are measured from a short live run when `calibrate` is
given a cluster.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..checks import positive_int, two_sizes
from ..model.custom import CustomModel
from ..model.gpt import ModelConfig, build_layer, loss_fn
from ..schedules.kinds import BACKWARD, FORWARD, KIND_SPECS, RECOMPUTE, kinds_with_role
from ..support.threads import one_thread
from ..model.memory import parameter_bytes
from ..sim.partition import uniform_bounds
from ..schedules import schedule
from .calibrate_custom import CustomCalibration, calibrate_custom

DEFAULT_LATENCY = 2e-4       # s per message: loopback gloo between two processes, measured here
DEFAULT_BANDWIDTH = 1e9      # bytes/s of a loopback all-reduce link


@dataclass(frozen=True)
class Calibration:
    """Per layer of the flat list (embedding, blocks…, head): forward and backward seconds as
    (fixed, per row), and the share of the backward that is weight-gradient work (W)."""
    cfg: ModelConfig
    forward: tuple[tuple[float, float], ...]
    backward: tuple[tuple[float, float], ...]
    w_share: tuple[float, ...]
    attention_share: tuple[float, ...]    # share of a block's forward in its attention core
    latency: float = DEFAULT_LATENCY
    bandwidth: float = DEFAULT_BANDWIDTH
    overhead: float = 0.0                 # s the runtime adds to every action (sends, hooks)
    # measured R over modelled R, per policy: the runtime's recomputation re-runs each region
    # under saved-tensor hooks, which costs more than the bare forward at small sizes
    recompute_scale: tuple[tuple[str, float], ...] = ()

    def forward_time(self, start: int, stop: int, rows: int) -> float:
        """Seconds of one microbatch's forward through layers [start, stop)."""
        return sum(a + b * rows for a, b in self.forward[start:stop])

    def backward_time(self, start: int, stop: int, rows: int) -> tuple[float, float]:
        """(I, W) seconds of one microbatch's backward through layers [start, stop)."""
        i = w = 0.0
        for (a, b), share in zip(self.backward[start:stop], self.w_share[start:stop]):
            took = a + b * rows
            i += (1 - share) * took
            w += share * took
        return i, w

    def recompute_time(self, start: int, stop: int, rows: int, policy: str) -> float:
        """Seconds the recomputation `R` of one microbatch repeats: the blocks' forwards under
        `full` (and `every-k`), their attention cores under `selective`, nothing under `none`."""
        if policy == "none":
            return 0.0
        blocks = range(max(start, 1), min(stop, self.cfg.n_layers + 1))
        share = (lambda i: self.attention_share[i]) if policy == "selective" else (lambda i: 1.0)
        scale = dict(self.recompute_scale).get(policy, 1.0)
        return scale * sum((self.forward[i][0] + self.forward[i][1] * rows) * share(i)
                           for i in blocks)


def flop_shares(cfg: ModelConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per layer: the W share of its backward, and the attention core's share of its forward."""
    s, h, f = cfg.seq_len, cfg.d_model, cfg.ffn_width
    matmul = 2 * s * (4 * h * h + 2 * h * f)        # per row, as layer_costs counts them
    attention = 4 * s * s * h
    w, core = [1.0], [0.0]                          # the embedding: a weight lookup only
    for _ in range(cfg.n_layers):
        w.append(matmul / (2 * matmul + 2 * attention))
        core.append(attention / (matmul + attention))
    w.append(0.5)                                   # the head: one Linear
    core.append(0.0)
    return tuple(w), tuple(core)


def calibrate(cfg: ModelConfig | CustomModel, *, rows: tuple[int, int] = (1, 4),
              repeats: int = 5, warmup: int = 3, latency: float | None = None,
              bandwidth: float | None = None, cluster=None,
              rounds: int = 3) -> Calibration | CustomCalibration:
    """Time every layer's forward and backward at two microbatch sizes (`rows` sequences) and
    fit seconds = fixed + per_row × rows. With a `cluster` (a pl.LocalCluster of 2+ ranks),
    short live runs also measure the message latency, the runtime's overhead per action and the
    all-reduce bandwidth (the best of `rounds`); otherwise `latency` and `bandwidth` (defaults
    DEFAULT_LATENCY, DEFAULT_BANDWIDTH) and no overhead.

    A `pl.CustomModel` is profiled layer by layer instead (calibrate_custom.py): its F, I and W
    and its bytes measured, one row per layer."""
    if isinstance(cfg, CustomModel):
        if cluster is not None:
            raise ValueError("calibrate(cluster=...) measures the runtime on the toy GPT; a "
                             "pl.CustomModel is calibrated from its layers alone: leave "
                             "cluster out (and give latency=, bandwidth= if you know them)")
        return calibrate_custom(cfg, rows=rows, repeats=repeats, warmup=warmup,
                                latency=latency, bandwidth=bandwidth)
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a pl.ModelConfig or a pl.CustomModel, got "
                         f"{type(cfg).__name__}")
    small, large = two_sizes("rows", rows)
    positive_int("repeats", repeats)
    at = {r: _layer_times(cfg, r, repeats, warmup) for r in rows}
    forward = tuple(_line(small, f0, large, f1) for (f0, _), (f1, _) in zip(at[small], at[large]))
    backward = tuple(_line(small, b0, large, b1) for (_, b0), (_, b1) in zip(at[small], at[large]))
    w_share, core = flop_shares(cfg)
    cal = Calibration(cfg, forward, backward, w_share, core,
                      DEFAULT_LATENCY if latency is None else float(latency),
                      DEFAULT_BANDWIDTH if bandwidth is None else float(bandwidth))
    if cluster is not None:
        cal = _live_corrections(cal, cluster, positive_int("rounds", rounds))
    return cal


def _line(x0: int, y0: float, x1: int, y1: float) -> tuple[float, float]:
    """(fixed, slope) through two measurements; neither part negative (timing noise)."""
    slope = max(0.0, (y1 - y0) / (x1 - x0))
    return max(0.0, y0 - slope * x0), slope


def _layer_times(cfg: ModelConfig, rows: int, repeats: int, warmup: int) -> list[tuple[float, float]]:
    """(forward, backward) median thread-CPU seconds per layer for `rows` sequences."""
    gen = torch.Generator().manual_seed(cfg.seed)
    idx = torch.randint(cfg.vocab_size, (rows, cfg.seq_len), generator=gen)
    hidden = torch.randn(rows, cfg.seq_len, cfg.d_model, generator=gen)
    grad = torch.randn(rows, cfg.seq_len, cfg.d_model, generator=gen)
    last = cfg.total_layers - 1
    with one_thread():                       # as a worker runs: one thread per rank
        out = []
        for i in range(cfg.total_layers):
            layer = build_layer(cfg, i)
            fwd, bwd = [], []
            for n in range(warmup + repeats):
                x = idx if i == 0 else hidden.clone().requires_grad_(True)
                t0 = time.thread_time()
                y = layer(x)
                t1 = time.thread_time()
                if i == last:
                    loss_fn(y, idx).backward()
                else:                        # as in a pipeline: a gradient arrives
                    y.backward(grad)
                t2 = time.thread_time()
                if n >= warmup:
                    fwd.append(t1 - t0)
                    bwd.append(t2 - t1)
            out.append((statistics.median(fwd), statistics.median(bwd)))
        return out


def _live_corrections(cal: Calibration, cluster, rounds: int = 3) -> Calibration:
    """Message latency and per-action overhead from live 1F1B steps on `cluster`; the
    all-reduce bandwidth from data-parallel steps (every rank a replica of the model). Each is
    the best of `rounds` runs: the planner predicts dedicated cores, and on shared ones the
    other programs only ever add time. Then one run per recomputation policy: how much its R
    costs live against the model (`recompute_scale`)."""
    from dataclasses import replace

    ranks = cluster.ranks
    if ranks < 2:
        raise ValueError("calibrate(cluster=...) needs a cluster of at least 2 ranks")
    cfg = cal.cfg
    m, rows = 2 * ranks, 1
    bounds = uniform_bounds(cfg.total_layers, ranks)
    moved = 2 * (ranks - 1) / ranks * parameter_bytes(cfg, 0, cfg.total_layers)
    latency, overhead, reduce = [], [], []
    timed = kinds_with_role(FORWARD, BACKWARD)      # the passes the layer-time model predicts
    for _ in range(rounds):
        res = cluster.run(schedule("1f1b", ranks=ranks, microbatches=m), model=cfg,
                          partition=bounds, batch_size=m * rows, check=False, progress=False)
        extra = [(e.cpu if e.cpu is not None else e.duration) - _modelled(cal, e.action, bounds, rows)
                 for e in res.timeline.events if e.action.kind in timed]
        latency.append(res.comm_latency)
        overhead.append(max(0.0, statistics.median(extra)))
        replicas = cluster.run(schedule("gpipe", ranks=1, microbatches=1), model=cfg,
                               batch_size=ranks, data_parallel=ranks, check=False, progress=False)
        reduce.append(replicas.reduction_transfer()[0])      # not the wait for the slowest
    cal = replace(cal, latency=min(latency), overhead=min(overhead),
                  # the ring's 2(n−1) rounds each pay one message latency (allreduce_time)
                  bandwidth=moved / max(min(reduce) - 2 * (ranks - 1) * min(latency), 1e-9))
    scale = []                                   # each policy's R, measured against the model
    recomputes = kinds_with_role(RECOMPUTE)
    for policy in ("selective", "full", "every-k"):
        res = cluster.run(schedule("1f1b", ranks=ranks, microbatches=m), model=cfg,
                          partition=bounds, batch_size=m * rows, check=False, progress=False,
                          recompute=policy)
        ratios = [((e.cpu if e.cpu is not None else e.duration) - cal.overhead)
                  / cal.recompute_time(*bounds[e.action.stage], rows, policy)
                  for e in res.timeline.events if e.action.kind in recomputes
                  and cal.recompute_time(*bounds[e.action.stage], rows, policy) > 0]
        if ratios:
            scale.append((policy, max(1.0, statistics.median(ratios))))
    return replace(cal, recompute_scale=tuple(scale))


def _modelled(cal: Calibration, action, bounds, rows: int) -> float:
    a, b = bounds[action.stage]
    if KIND_SPECS[action.kind].role == FORWARD:
        return cal.forward_time(a, b, rows)
    return sum(cal.backward_time(a, b, rows))
