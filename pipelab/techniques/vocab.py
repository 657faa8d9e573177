"""The vocabulary layers cut into shards: the arithmetic of vocabulary parallelism.

Rank r of p holds rows `shard_rows(V, p, r)` of the output projection W (V × h) and of the
token embedding. The output layer's forward on X (n tokens × h) never forms the full logits:

    S      z_r = X·W_rᵀ;  m_r = max z_r;  s_r = Σ exp(z_r − m_r);  P_r = exp(z_r − m_r) / s_r
    C0     M = max_r m_r (all-reduce MAX, first: no exponential can overflow);
           c_r = s_r·e^(m_r − M);  S = Σ_r c_r;  y = Σ_r [t ∈ r](z_t − M)  (all-reduce SUM)
    loss   ℓ = log S − y = logsumexp(z) − z_t
    T      α_r = c_r / S turns P_r into the global softmax on the shard (no logits recomputed);
           D_r = (α_r·P_r − onehot_r)·g;  dW_r = D_rᵀ·X;  dX = Σ_r D_r·W_r

Vocab-2 fuses dX into C0: Σ_r c_r·(P_r·W_r) and Σ_r W_r[t] are summed in the same all-reduce,
then dX = g·(Σ c_r·P_r·W_r / S − W[t]). These functions are the single-process form of that
algebra (shards as a list); the runtime's handlers (vocab_passes.py) call the same per-shard
steps with torch.distributed all-reduces in between.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.gpt import ModelConfig, shard_rows  # noqa: F401  (re-exported: the shards of this technique)


@dataclass
class Partials:
    """What S leaves on one shard for its barrier and its T (per token: n rows)."""
    first: int                    # the shard's first vocabulary row
    probs: torch.Tensor           # P_r, n × V/p: the softmax of the shard alone
    row_max: torch.Tensor         # m_r
    row_sum: torch.Tensor         # s_r
    target_logit: torch.Tensor    # z_t where t is in the shard, else 0
    in_shard: torch.Tensor        # bool, t in the shard
    local_target: torch.Tensor    # t − first (clamped into the shard where t is outside)


def shard_forward(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  first: int) -> Partials:
    """The S pass on one shard: x (n × h), weight = W_r (rows × h), targets (n,)."""
    z = x @ weight.t()
    row_max = z.max(dim=1).values
    e = torch.exp(z - row_max[:, None])
    row_sum = e.sum(dim=1)
    local = targets - first
    in_shard = (local >= 0) & (local < weight.shape[0])
    local = local.clamp(0, weight.shape[0] - 1)
    picked = z.gather(1, local[:, None]).squeeze(1)
    return Partials(first, e / row_sum[:, None], row_max, row_sum,
                    torch.where(in_shard, picked, torch.zeros_like(picked)), in_shard, local)


def shifted_target(part: Partials, global_max: torch.Tensor) -> torch.Tensor:
    """[t ∈ r](z_t − M): summed over the shards, the target's logit below the global max."""
    return torch.where(part.in_shard, part.target_logit - global_max,
                       torch.zeros_like(global_max))


def rescaled_sum(part: Partials, global_max: torch.Tensor) -> torch.Tensor:
    """c_r = s_r·e^(m_r − M): the shard's sum of exponentials against the global max."""
    return part.row_sum * torch.exp(part.row_max - global_max)


def fused_partials(part: Partials, weight: torch.Tensor,
                   rescaled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Vocab-2's extra all-reduce terms: c_r·P_r·W_r − [t ∈ r]·W_r[t] (n × h). Summed over
    the shards and with c_r/S in place of c_r this is (softmax − onehot)·W, the dX of g = 1."""
    target_rows = weight[part.local_target] * part.in_shard[:, None]
    return rescaled[:, None] * (part.probs @ weight), target_rows


def shard_softmax_grad(part: Partials, share: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """D_r = (α_r·P_r − onehot_r)·g: the logits' gradient on the shard (n × rows)."""
    d = part.probs * share[:, None]
    rows = torch.nonzero(part.in_shard).squeeze(1)
    d[rows, part.local_target[rows]] -= 1.0
    return d * grad[:, None]


def sharded_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          shards: int, fused: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of x·Wᵀ against targets, and its gradients (dX, dW), computed shard
    by shard as vocabulary parallelism does (the all-reduces are sums and maxima over the
    list). `fused=True` forms dX as Vocab-2 does, in the barrier; else as Vocab-1, from T."""
    n = x.shape[0]
    grad = torch.full((n,), 1.0 / n, dtype=x.dtype)
    bounds = [shard_rows(weight.shape[0], shards, r) for r in range(shards)]
    parts = [shard_forward(x, weight[a:b], targets, a) for a, b in bounds]
    global_max = torch.stack([p.row_max for p in parts]).max(dim=0).values        # MAX
    rescaled = [rescaled_sum(p, global_max) for p in parts]
    total = torch.stack(rescaled).sum(dim=0)                                       # SUM
    target = torch.stack([shifted_target(p, global_max) for p in parts]).sum(dim=0)
    loss = (torch.log(total) - target).mean()
    shares = [c / total for c in rescaled]
    grads_w = []
    dx = torch.zeros_like(x)
    for p, (a, b), share in zip(parts, bounds, shares):
        d = shard_softmax_grad(p, share, grad)
        grads_w.append(d.t() @ x)
        if not fused:
            dx += d @ weight[a:b]                                                  # C1: SUM
    if fused:
        terms = [fused_partials(p, weight[a:b], c) for p, (a, b), c in zip(parts, bounds, rescaled)]
        weighted = torch.stack([t[0] for t in terms]).sum(dim=0)                   # C: SUM
        rows = torch.stack([t[1] for t in terms]).sum(dim=0)
        dx = grad[:, None] * (weighted / total[:, None] - rows)
    return loss, dx, torch.cat(grads_w)


def parameter_bytes(cfg: ModelConfig, ranks: int, sharded: bool, bytes_per: int = 4) -> list[int]:
    """Bytes of vocabulary parameters (token embedding and output projection) on each rank:
    V·h on the first and on the last rank without sharding (one table twice when tied, on
    different ranks), about 2·V·h/p on every rank with it (V·h/p when tied: one table)."""
    v, h = cfg.vocab_size, cfg.d_model
    tables = 1 if cfg.tie_embeddings else 2
    if sharded:
        return [tables * (b - a) * h * bytes_per
                for a, b in (shard_rows(v, ranks, r) for r in range(ranks))]
    out = [0] * ranks
    out[0] += v * h * bytes_per
    if not (cfg.tie_embeddings and ranks == 1):
        out[-1] += v * h * bytes_per
    return out
