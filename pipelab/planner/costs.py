"""The planner's time model: a candidate's stage costs for the simulator (plan.py).

Each layer's forward and backward time comes from the calibration (calibrate.py); on top, what
each parallelism adds: the runtime's overhead per action, recomputation's `R`, tensor
parallelism's shards and all-reduces, vocabulary parallelism's passes and barriers, expert
parallelism's all-to-alls, data parallelism's gradient all-reduce (the simulator's ring).
"""
from __future__ import annotations

import numpy as np

from .calibrate import Calibration
from .candidate import Candidate
from ..model.memory import _blocks, parameter_bytes
from ..model.gpt import ModelConfig
from ..techniques.recompute import RECOMPUTE
from ..schedules.reductions import allreduce_time
from ..sim.costs import Costs
from ..model.memory_moe import kept_rows, moe_parameters


def stage_costs(c: Candidate, cal: Calibration) -> Costs:
    """Stage costs of the candidate: calibrated layer times summed per stage, the runtime's
    overhead on every action, and the recomputation `R` its policy repeats. Under tensor
    parallelism a shard computes 1/t of every block's per-row work (the matmuls and heads
    split; the LayerNorms, counted in, are small), all of its fixed time, and the whole
    embedding and head (replicated), and each
    forward and input-gradient pass ends in two all-reduces of one activation per block
    (`tp_allreduce`, which the simulator overlaps where the step allows: sim/tensor_overlap.py)."""
    F, I, W, R = [], [], [], []
    last, shrink = cal.cfg.total_layers - 1, 1 - 1 / c.tensor
    exchange = _expert_exchange(c, cal)
    for a, b in c.bounds:
        if c.vocab:              # the embedding and the head run as the shards' passes
            a, b = max(a, 1), min(b, last)
        lo, hi = max(a, 1), min(b, last)                  # the stage's blocks
        grad_in, grad_w = cal.backward_time(a, b, c.rows)
        # what a shard divides: the blocks' per-row work, not their fixed (launch) time
        rows_in, rows_w = np.subtract(cal.backward_time(lo, hi, c.rows),
                                      cal.backward_time(lo, hi, 0))
        rows_f = cal.forward_time(lo, hi, c.rows) - cal.forward_time(lo, hi, 0)
        F.append(cal.forward_time(a, b, c.rows) - shrink * rows_f + cal.overhead
                 + exchange * (hi - lo))
        I.append(grad_in - shrink * rows_in + cal.overhead + exchange * (hi - lo))
        W.append(grad_w - shrink * rows_w + cal.overhead)
        R.append(cal.recompute_time(a, b, c.rows, c.recompute) + cal.overhead)
    message = c.rows * cal.cfg.seq_len * cal.cfg.d_model * 4      # one activation, float32
    kinds = {RECOMPUTE: R, **(_vocab_kinds(c, cal) if c.vocab else {})}
    tensor = {} if c.tensor == 1 else {"tp_allreduce": [        # per pass: 2 a block
        2 * _blocks(cal.cfg, a, b) * _all_reduce(cal, message // 4, c.tensor) for a, b in c.bounds]}
    return Costs.per_stage(F=F, I=I, W=W, B=[i + w - cal.overhead for i, w in zip(I, W)],
                           kinds=kinds, comm=cal.latency + message / cal.bandwidth, unit="s",
                           bandwidth=cal.bandwidth, latency=cal.latency,
                           parameter_bytes=[_reduced_bytes(c, cal.cfg, a, b)
                                            for a, b in c.bounds],
                           replicas=c.data_parallel, **tensor)     # each stage's own bounds


def _expert_exchange(c: Candidate, cal: Calibration) -> float:
    """Seconds a block's pass (F, or I) spends in expert parallelism's two all-to-alls (dispatch
    and combine, each a count exchange then the rows): the (ep−1)/ep of the kept assignments
    that leave the process, at the link's bandwidth, with a balanced router (the experts'
    compute per process is then what it is on one: memory_moe.kept_rows)."""
    if c.expert == 1:
        return 0.0
    moved = (c.expert - 1) / c.expert * kept_rows(cal.cfg, c.rows)[0] * cal.cfg.d_model * 4
    return 2 * (2 * cal.latency + moved / cal.bandwidth)


def _reduced_bytes(c: Candidate, cfg: ModelConfig, a: int, b: int) -> int:
    """Gradient bytes a stage all-reduces over the replicas: its parameters on one process,
    less the experts each process holds alone under expert parallelism."""
    total = parameter_bytes(cfg, a, b, tensor=c.tensor, expert=c.expert)
    if c.expert == 1:
        return total
    router = cfg.d_model * cfg.n_experts
    return total - _blocks(cfg, a, b) * (moe_parameters(cfg, c.expert)[0] - router) * 4


def _all_reduce(cal: Calibration, floats: int, n: int, rounds: int = 1) -> float:
    """Seconds of `rounds` ring all-reduces of `floats` float32 in all over `n` processes."""
    return rounds * allreduce_time(floats * 4, n, cal.bandwidth, cal.latency)


def _vocab_kinds(c: Candidate, cal: Calibration) -> dict[str, float]:
    """Costs of the vocabulary passes, derived from the calibrated layers (not measured per
    shard): S is the head's forward over 1/p of the vocabulary, T its backward (dW_r, and dX_r
    under vocab-1), Vf and Vb the embedding's forward and backward over 1/p of it plus their
    collective of one activation; each barrier is its ring all-reduces: Cs the max, then the sum and target logit (2 floats a token); Ct the
    output-layer input gradient (h a token); C the max, then 2 + 2h floats a token."""
    p, head = c.pipeline, cal.cfg.total_layers - 1
    tokens, h = c.rows * cal.cfg.seq_len, cal.cfg.d_model

    def all_reduce(floats: int, rounds: int = 1) -> float:
        return _all_reduce(cal, floats, p, rounds)

    return {"S": cal.forward_time(head, head + 1, c.rows) / p + cal.overhead,
            "T": sum(cal.backward_time(head, head + 1, c.rows)) / p + cal.overhead,
            "Vf": cal.forward_time(0, 1, c.rows) / p + all_reduce(tokens * h),
            "Vb": sum(cal.backward_time(0, 1, c.rows)) / p + all_reduce(tokens * h),
            "Cs": all_reduce(2 * tokens, rounds=2), "Ct": all_reduce(tokens * h),
            "C": all_reduce(tokens * (2 + 2 * h), rounds=2)}
