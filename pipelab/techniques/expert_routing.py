"""What the routers did, and what it costs: token counts per expert, and stage times that follow.

A live run records, for every MoE layer of every microbatch of every step, how many assignments
the router sent to each expert and how many of them were dropped (`RunResult.routing`). Under
expert parallelism each process runs the experts it holds on every token sent to them, and the
all-to-all makes the whole group wait for the busiest one; so a stage's time for a microbatch is
its dense part plus an expert part that grows with the *largest* load in the group. Uneven
microbatches make uneven pipeline steps — bubbles. `routed_costs` turns measured counts into
per-action costs for the simulator; `balanced` counts give the same work spread evenly.

The expert part's size is the stage's *FLOP share* spent in experts (`expert_share`, from the
model's cost profile), scaled by the load ratio; it is not a separately fitted per-token time, so
it is as good as FLOPs are at predicting where a stage's time goes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..model.gpt import ModelConfig, layer_costs
from ..sim.costs import Costs


@dataclass
class Routing:
    """Counts of one training step: `routed[mb, l, e]` assignments the router sent to expert e
    of MoE layer `layers[l]` in microbatch mb (summed over data-parallel replicas), `dropped`
    those of them past capacity. `kept` = routed − dropped: what the experts computed."""
    layers: list[int]
    routed: torch.Tensor
    dropped: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        return self.routed - self.dropped

    def tokens_per_expert(self) -> torch.Tensor:
        """(layers, E): assignments per expert over the step's microbatches."""
        return self.routed.sum(0)

    def dropped_tokens(self) -> int:
        return int(self.dropped.sum())


def routing_of(step_reports: list[dict], microbatches: int) -> Routing | None:
    """Sum the routing records of one step over the processes that made them (see
    expert.step_records); None when the run had no MoE layer."""
    records = [rec for rep in step_reports for rec in rep.get("routing", ())]
    if not records:
        return None
    layers = sorted({layer for _mb, layer, _r, _d in records})
    n = len(records[0][2])
    routed = torch.zeros(microbatches, len(layers), n, dtype=torch.long)
    dropped = torch.zeros_like(routed)
    for mb, layer, r, d in records:
        routed[mb, layers.index(layer)] += torch.tensor(r)
        dropped[mb, layers.index(layer)] += torch.tensor(d)
    return Routing(layers, routed, dropped)


def balanced(routing: Routing, top_k: int, tokens: int) -> Routing:
    """The same step under a perfectly balanced router: each of E experts gets k·tokens/E of
    the `tokens` of a microbatch (over the replicas) and drops nothing."""
    n = routing.routed.shape[-1]
    even = torch.full_like(routing.routed, top_k * tokens // n)
    return Routing(routing.layers, even, torch.zeros_like(even))


def expert_share(cfg: ModelConfig, start: int, stop: int) -> float:
    """Share of a stage's forward FLOPs (layers [start, stop)) spent in experts when routing
    is balanced, from the cost profile (the model's layer_costs)."""
    rows = layer_costs(cfg)[start:stop]
    total = sum(r["flops"] for r in rows)
    s, h, f = cfg.seq_len, cfg.d_model, cfg.ffn_width
    experts = sum(2 * s * cfg.top_k * 2 * h * f for r in rows if r["kind"] == "block")
    return experts / total if total else 0.0


def group_load(kept: torch.Tensor, expert_parallel: int) -> torch.Tensor:
    """Per (..., layer): the largest number of rows one process of the expert-parallel group
    runs through its experts (E/ep consecutive experts each). With ep = 1: all of them."""
    *lead, n = kept.shape
    return kept.view(*lead, expert_parallel, n // expert_parallel).sum(-1).max(-1).values


def routed_costs(schedule, costs: Costs, cfg: ModelConfig, bounds, routing: Routing,
                 expert_parallel: int = 1, reference: Routing | None = None) -> Costs:
    """`costs` (one microbatch's times per kind and stage, under `reference` routing — by
    default a balanced router) with every F, B, I and W re-timed for its microbatch: the
    stage's expert share scales with the busiest process's load, summed over its MoE layers,
    relative to the reference's. Returned as `per_action` costs for `simulate`."""
    tokens = int(routing.routed[0, 0].sum()) // cfg.top_k
    reference = reference or balanced(routing, cfg.top_k, tokens)
    load = group_load(routing.kept, expert_parallel).double()          # (m, layers)
    base = group_load(reference.kept, expert_parallel).double()
    per_action = {}
    table = costs.for_schedule(schedule)       # per stage, as the simulator divides a rank's worth
    for rank_actions in schedule.actions:
        for item in rank_actions:
            for part in item.parts:
                if part.kind not in ("F", "B", "I", "W"):
                    continue
                start, stop = bounds[part.stage]
                mine = [i for i, layer in enumerate(routing.layers) if start <= layer < stop]
                share = expert_share(cfg, start, stop) if mine else 0.0
                ratio = (load[part.microbatch, mine].sum() / base[part.microbatch, mine].sum()
                         ).item() if mine else 1.0
                per_action[part] = table.of(part.kind, part.stage) * (1 - share + share * ratio)
    return replace(costs, per_action=per_action)
