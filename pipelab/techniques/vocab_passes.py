"""What the vocabulary passes compute on each rank (handlers for the kinds of schedules/vocab.py).

Setup: every rank takes its shard of the token embedding and of the output projection (rows
`shard_rows(V, p, rank)` of the unsplit model's weights, as parameters the optimizer updates);
rank 0's embedding keeps only the position table (the word vectors come from `Vf`), and the
last stage's head keeps only its LayerNorm (its output X goes to every rank's `S`).

The barriers are blocking all-reduces here (the simulator puts them on a side lane, as the
paper's side stream; on 2 CPU cores there is no spare core to run them beside the compute).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..model.gpt import build_layer
from ..runtime.handlers import register_handler
from ..runtime.plugins import process_group
from ..runtime.techniques import Technique, register_technique
from ..schedules import Action
from ..schedules.graph import members_of
from ..schedules.vocab import VOCAB_KINDS
from .vocab import (fused_partials, rescaled_sum, shard_forward, shard_rows, shard_softmax_grad,
                    shifted_target)


class PositionEmbedding(nn.Module):
    """Rank 0's first layer under vocabulary parallelism: word vectors in, positions added."""

    def __init__(self, pos: nn.Embedding):
        super().__init__()
        self.pos = pos

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return words + self.pos(torch.arange(words.shape[1]))


class FinalNorm(nn.Module):
    """The last stage's head without its projection: X = LayerNorm(x), sent to every S."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        self.ln = ln

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def take_shards(spec, rank: int, stages) -> None:
    """Cut this rank's vocabulary shards out of the unsplit layers (same init, same weights)."""
    cfg, ranks = spec.cfg, spec.schedule.ranks
    first, stop = shard_rows(cfg.vocab_size, ranks, rank)
    last_layer = cfg.total_layers - 1
    embedding, head = build_layer(cfg, 0), build_layer(cfg, last_layer)
    tok = nn.Parameter(embedding.tok.weight.detach()[first:stop].clone())
    shape = tuple(embedding.tok.weight.shape)
    stages.shards["layers.0.tok.weight"] = (tok, first, shape)
    if cfg.tie_embeddings:           # one table: the head reads the embedding's rows
        out = tok
    else:
        out = nn.Parameter(head.out.weight.detach()[first:stop].clone())
        stages.shards[f"layers.{last_layer}.out.weight"] = (out, first, shape)
    stages.vocab_shard = (first, tok, out)
    for s, module in stages.modules.items():
        a, b = stages.bounds[s]
        if a == 0:
            module[0] = PositionEmbedding(module[0].pos)
        if b == cfg.total_layers:
            module[-1] = FinalNorm(module[-1].ln)


def _group(state, action):
    members = members_of(state.schedule, action)
    return process_group(members), members


def _tokens(state, mb: int, which: int) -> torch.Tensor:
    return state.microbatches[mb][which].reshape(-1)


@register_handler("S", setup=take_shards)
def output_forward(state, a: Action, inputs: dict) -> None:
    first, _tok, weight = state.stages.vocab_shard
    x = inputs["x"].reshape(-1, inputs["x"].shape[-1])
    with torch.no_grad():
        part = shard_forward(x, weight, _tokens(state, a.microbatch, 1), first)
    # What T will need is activation memory like any other: X's copy and the shard's softmax.
    for kept in (x, part.probs):
        state.meter.hold(kept)
    state.scratch[("S", a.microbatch)] = (x, part)
    return None


def _barrier(state, a: Action, fused: bool) -> torch.Tensor | None:
    """C0 (and, fused, Vocab-2's input gradient): MAX, then one packed SUM."""
    group, _ = _group(state, a)
    x, part = state.scratch[("S", a.microbatch)]
    with torch.no_grad():
        global_max = part.row_max.clone()
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        rescaled = rescaled_sum(part, global_max)
        pieces = [rescaled[:, None], shifted_target(part, global_max)[:, None]]
        if fused:
            _, _, weight = state.stages.vocab_shard
            pieces += list(fused_partials(part, weight, rescaled))
        packed = torch.cat(pieces, dim=1)
        dist.all_reduce(packed, group=group)
        total, target = packed[:, 0], packed[:, 1]
        n = total.shape[0]
        if state.schedule.rank_of(state.last_stage) == dist.get_rank():
            state.losses[a.microbatch] = (torch.log(total) - target).mean().item()
        # The mean over the microbatch's tokens and over the m microbatches (and replicas).
        grad = torch.full((n,), 1.0 / (n * state.m * state.replicas))
        state.scratch[("C", a.microbatch)] = (rescaled / total, grad)
        if not fused:
            return None
        h = x.shape[1]
        weighted, rows = packed[:, 2:2 + h], packed[:, 2 + h:]
        dx = grad[:, None] * (weighted / total[:, None] - rows)
        return dx.reshape(state.microbatches[a.microbatch][0].shape + (h,))


@register_handler("Cs")
def barrier_c0(state, a: Action, inputs: dict) -> None:
    return _barrier(state, a, fused=False)


@register_handler("C")
def barrier_fused(state, a: Action, inputs: dict) -> torch.Tensor:
    return _barrier(state, a, fused=True)


@register_handler("T")
def output_backward(state, a: Action, inputs: dict) -> None:
    _first, _tok, weight = state.stages.vocab_shard
    x, part = state.scratch.pop(("S", a.microbatch))
    share, grad = state.scratch.pop(("C", a.microbatch))
    with torch.no_grad():
        d = shard_softmax_grad(part, share, grad)
        dw = d.t() @ x
        weight.grad = dw if weight.grad is None else weight.grad + dw
        if "Ct" in state.schedule.kinds():       # Vocab-1: this shard's part of dX, for C1
            state.scratch[("T", a.microbatch)] = d @ weight
    for kept in (x, part.probs):
        state.meter.drop(kept)
    return None


@register_handler("Ct")
def barrier_c1(state, a: Action, inputs: dict) -> torch.Tensor:
    group, _ = _group(state, a)
    dx = state.scratch.pop(("T", a.microbatch))
    dist.all_reduce(dx, group=group)
    return dx.reshape(state.microbatches[a.microbatch][0].shape + (dx.shape[1],))


@register_handler("Vf")
def embedding_forward(state, a: Action, inputs: dict) -> torch.Tensor:
    first, tok, _ = state.stages.vocab_shard
    group, _ = _group(state, a)
    ids = state.microbatches[a.microbatch][0]
    local = ids - first
    in_shard = (local >= 0) & (local < tok.shape[0])
    with torch.no_grad():
        words = torch.zeros(ids.shape + (tok.shape[1],))
        words[in_shard] = tok[local[in_shard]]
        dist.all_reduce(words, group=group)
    if state.schedule.rank_of(0) == dist.get_rank():
        state.scratch[("Vf", a.microbatch)] = words      # F makes it a leaf; B fills its grad
    return words


@register_handler("Vb")
def embedding_backward(state, a: Action, inputs: dict) -> None:
    first, tok, _ = state.stages.vocab_shard
    group, members = _group(state, a)
    ids = state.microbatches[a.microbatch][0]
    owner = state.schedule.rank_of(0)
    if owner == dist.get_rank():
        grad = state.scratch.pop(("Vf", a.microbatch)).grad.contiguous()
    else:
        grad = torch.empty(ids.shape + (tok.shape[1],))
    dist.broadcast(grad, src=owner, group=group)
    local = ids - first
    in_shard = (local >= 0) & (local < tok.shape[0])
    with torch.no_grad():
        add = torch.zeros_like(tok).index_add_(0, local[in_shard], grad[in_shard])
        tok.grad = add if tok.grad is None else tok.grad + add
    return None


def prepare_run(draft) -> bool:
    """A schedule with the vocabulary passes: each rank holds a shard of both tables (its setup
    is the S handler's, take_shards), so the model is split as if its tables were untied."""
    if not draft.schedule.kinds() & VOCAB_KINDS:
        return False
    draft.split_untied = True
    return True


register_technique(Technique("vocabulary", prepare=prepare_run))
