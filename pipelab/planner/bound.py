"""A lower bound on a candidate's simulated step time, in closed form over its schedule's rows
(rows.py): what lets the pruned search (plan.py) skip the simulations that cannot matter.

For each rank r, three stretches that cannot overlap:

- the fill: every forward, backward (B, I, W) or recomputation R on r works on a stage s of r
  and waits, at least, for microbatch j's forwards on every stage before s (each one's F, plus
  `comm` where the chain crosses ranks): the shortest such chain to a stage of r;
- the work: those actions run one after the other on r's compute, each its cost (under
  tensor parallelism the simulator adds the all-reduces it cannot hide, never less);
- the drain: if r's last such action is a backward (B or I) of stage s > 0, the backward of
  the same microbatch still runs on every stage below s (each at least min(B, I), plus
  `comm` where it crosses ranks); and if it is a B, I or W of stage s with data parallelism,
  s's gradient all-reduce still runs after it (with_data_parallel puts it right after the
  stage's last backward): the longer of the two. A forward ends with no such chain: 0.

The step is at least the largest fill + work + drain of any rank. What it leaves out (the
bubbles inside the step, the other all-reduces, the vocabulary passes) only makes it lower:
it stays a bound. tests/test_plan_prune.py checks it is never above the simulated step time.
"""
from __future__ import annotations

import numpy as np

from ..sim.costs import Costs
from ..sim.tensor_overlap import lone_step_times
from ..techniques.data_parallel import REDUCE
from ..techniques.recompute import RECOMPUTE
from .rows import CODE, Rows

CHAIN = ("F", "B", "I", "W", RECOMPUTE)       # the kinds whose stage waits for the fill
BACKWARD = ("B", "I")                         # a backward that passes its gradient down
GRADIENT = ("B", "I", "W")                    # after a stage's last, its all-reduce (dp > 1)


def chain_costs(costs: Costs, stages: int) -> np.ndarray | None:
    """Each CHAIN kind's time on each stage as the simulator takes it (under tensor
    parallelism, with the all-reduces it waits for), and a last row: each stage's gradient
    all-reduce over the replicas (0 without). None when the costs are not the planner's kind
    of table (per stage, per microbatch; not measured per action, nor overlapped): then there
    is no bound."""
    if costs.per_action is not None or costs.per != "microbatch" or costs.scope != "stage" \
            or costs.overlap is not None:
        return None
    if costs.tensor_parallel:
        rows = [lone_step_times(costs, kind, stages) if _has(costs, kind) else np.zeros(stages)
                for kind in CHAIN]
    else:
        rows = [costs.of_stages(kind, stages) if _has(costs, kind) else np.zeros(stages)
                for kind in CHAIN]
    reduce = costs.of_stages(REDUCE, stages) if (costs.replicas or 1) > 1 else np.zeros(stages)
    return np.array(rows + [reduce])


def time_bound(rows: Rows, cost: np.ndarray | None, comm: float) -> float:
    """What the simulated step of these rows cannot beat, on `cost` (chain_costs) with `comm`
    on each message between ranks; 0 without costs."""
    if cost is None:
        return 0.0
    counts, last_kind, last_stage = _tally(rows)
    work = np.einsum("rks,ks->r", counts, cost[:len(CHAIN)])
    crosses = np.where(rows.crossing, comm, 0.0)          # between stage s and s + 1
    fill = np.concatenate(([0.0], np.cumsum(cost[0, :-1] + crosses)))
    down = np.minimum(cost[CHAIN.index("B")], cost[CHAIN.index("I")])
    drain = np.concatenate(([0.0], np.cumsum(down[:-1] + crosses)))
    head = np.full(rows.ranks, np.inf)
    np.minimum.at(head, np.asarray(rows.placement), fill)
    backward = _ENDS_IN_BACKWARD[last_kind]         # (index −1: no chain action, False)
    gradient = _ENDS_IN_GRADIENT[last_kind]
    busy = head + work + np.maximum(np.where(backward, drain[last_stage], 0.0),
                                    np.where(gradient, cost[-1][last_stage], 0.0))
    # Lowered by a billionth: the simulator adds the same costs in another order, and a tight
    # bound rounded up could pass the time it bounds, and prune a candidate equal to the best.
    return float(busy[np.isfinite(busy)].max(initial=0.0)) * (1 - SLACK)


SLACK = 1e-9


_ENDS_IN_BACKWARD = np.array([k in BACKWARD for k in CHAIN] + [False])
_ENDS_IN_GRADIENT = np.array([k in GRADIENT for k in CHAIN] + [False])


def _tally(rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the bound reads of the rows, whatever the costs (kept on them): how many actions
    of each CHAIN kind each rank runs on each stage, and each rank's last one's kind (an index
    in CHAIN, −1 if none) and stage."""
    if rows.tally is None:
        number = np.full(len(CODE), -1, np.int64)
        number[[CODE[k] for k in CHAIN]] = np.arange(len(CHAIN))
        kind = number[rows.kind]
        mine = kind >= 0
        rank, kind, stage = rows.rank[mine], kind[mine], rows.stage[mine]
        stages = len(rows.placement)
        counts = np.bincount((rank * len(CHAIN) + kind) * stages + stage,
                             minlength=rows.ranks * len(CHAIN) * stages)
        last = np.searchsorted(rank, np.arange(rows.ranks), side="right") - 1
        has = last >= 0
        has[has] = rank[last[has]] == np.flatnonzero(has)    # else: an earlier rank's
        last_kind, last_stage = np.full(rows.ranks, -1), np.zeros(rows.ranks, np.int64)
        last_kind[has], last_stage[has] = kind[last[has]], stage[last[has]]
        rows.tally = counts.reshape(rows.ranks, len(CHAIN), stages), last_kind, last_stage
    return rows.tally


def _has(costs: Costs, kind: str) -> bool:
    """Whether the table costs `kind` (a kind without a cost the schedule cannot run)."""
    try:
        costs.of(kind, 0)
    except ValueError:
        return False
    return True
