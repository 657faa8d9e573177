"""A mixture-of-experts MLP: a softmax router sends each token to its top-k experts.

    cfg = pl.ModelConfig(..., n_experts=4, top_k=2, capacity_factor=1.25, aux_loss_coef=0.01)

Every block's MLP becomes `MoEMLP`: E small MLPs ("experts") and a router, a Linear from
d_model to E logits. For each token the router's softmax gives E probabilities; the token goes to
the k most probable experts, and the expert outputs are summed weighted by those probabilities.

Routing is decided per *group* — one sequence, as GShard's groups — so a token's fate never
depends on which other sequences share its microbatch: a pipeline that splits the batch into
microbatches, or replicas, routes every token exactly as the unsplit model does.

- **Capacity**: each expert takes at most ⌈capacity_factor · tokens · k / E⌉ tokens of a group
  (tokens = the group's length). Assignments are served first choices first, then second
  choices, in token order within each; the ones past capacity are *dropped*: that expert adds
  nothing for that token, and a token dropped by all its experts passes through the block's
  residual unchanged.
- **Ties**: equal probabilities go to the lower expert index (a stable sort), so the routing
  is deterministic and the same on every process.
- **Load-balancing loss** (Switch Transformer, Fedus et al., arXiv 2101.03961):
  α · E · Σᵢ fᵢ·Pᵢ per group, fᵢ the share of the group's k·tokens assignments routed to expert i
  (before capacity), Pᵢ its mean router probability; averaged over groups, so it splits over
  microbatches like the mean cross-entropy. Perfect balance gives α. Its gradient enters through
  `attach_aux_loss` (the forward passes the activation through; the backward adds the loss's
  gradient), so no stage needs to send it anywhere.

Where the experts run is the `exchange`'s business: `LOCAL` (every expert here) or, for expert
parallelism, an all-to-all over a process group (techniques/expert.py). The dispatch code is the
same for both.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .weight_grad import Linear
from ..checks import positive_int, positive_number


class Expert(nn.Module):
    """One expert: the dense block's MLP, up-projection, GELU, down-projection."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = Linear(d_model, d_ff)
        self.down = Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Most assignments one expert takes from a group of `tokens`: ⌈c · tokens · k / E⌉."""
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


class Routing:
    """The router's decisions for a batch of groups (b groups × s tokens):

    `expert[b, j, s]` the j-th choice of token s, `gate` its probability, `kept` whether it is
    within capacity; `probs` (b, s, E) the router's softmax; `aux` the load-balancing loss."""

    def __init__(self, probs: torch.Tensor, top_k: int, capacity_factor: float, coef: float):
        b, s, n = probs.shape
        # A stable descending sort: on equal probabilities the lower expert index comes first.
        order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices
        self.expert = order[..., :top_k].transpose(1, 2)                     # (b, k, s)
        self.gate = probs.gather(-1, self.expert.transpose(1, 2)).transpose(1, 2)
        onehot = F.one_hot(self.expert, n)                                   # (b, k, s, E)
        # Position of each assignment in its expert's queue: first choices before second
        # choices, token order within a choice.
        flat = onehot.reshape(b, top_k * s, n)
        position = ((flat.cumsum(dim=1) - 1) * flat).sum(-1).view(b, top_k, s)
        self.capacity = capacity(s, n, top_k, capacity_factor)
        self.kept = position < self.capacity
        self.probs = probs
        self.routed = onehot.sum(dim=(1, 2))                                 # (b, E) before capacity
        self.dropped = (onehot * (~self.kept).unsqueeze(-1)).sum(dim=(1, 2))  # (b, E)
        share = self.routed.to(probs.dtype) / (top_k * s)                    # fᵢ per group
        self.aux = coef * n * (share * probs.mean(dim=1)).sum(-1).mean()


# --- the aux loss's gradient and the share of the batch a forward holds ----------------------
_loss_share = [1.0]


@contextmanager
def loss_share(share: float):
    """Inside: forwards hold `share` of the batch's loss (a pipeline microbatch of m, over
    replicas: 1 / (m · replicas)), so each layer's aux loss enters the gradient scaled alike."""
    _loss_share.append(share)
    try:
        yield
    finally:
        _loss_share.pop()


class _AttachAux(torch.autograd.Function):
    """Identity on `x`; in backward, the aux loss gets gradient `scale` (it is part of the
    objective without travelling down the pipeline)."""

    @staticmethod
    def forward(ctx, x, aux, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.scale, dtype=grad.dtype), None


def attach_aux_loss(x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    if not aux.requires_grad:
        return x
    return _AttachAux.apply(x, aux, _loss_share[-1])


# --- what the layers saw: routing counts and all-to-all spans, for the runtime's report -----
LOG: list | None = None     # a list while a rank records a training step, else None


@contextmanager
def recording():
    """Collect ("route", time, layer, routed (E,), dropped (E,)), ("a2a", start, end, kind,
    layer, bytes sent) and ("experts", start, end, layer, rows) records (the forward's expert
    compute) from every MoE layer of this process into the yielded list."""
    global LOG
    LOG, records = [], []
    try:
        yield records
    finally:
        records.extend(LOG)
        LOG = None


class LocalExchange:
    """Every expert lives here: dispatching and combining move nothing.

    An exchange's `dispatch(counts, rows, layer)` sends rows sorted by expert (`counts` per
    expert) to the experts' processes and returns (received counts as (sources, local experts),
    the received rows, a handle); `combine(rows, handle, layer)` sends the results back."""
    size, index = 1, 0

    def dispatch(self, counts: torch.Tensor, rows: torch.Tensor, layer: int):
        return counts.view(1, -1), rows, None

    def combine(self, rows: torch.Tensor, handle, layer: int) -> torch.Tensor:
        return rows


LOCAL = LocalExchange()


class MoEMLP(nn.Module):
    """Router + E experts (`experts[str(e)]`, so an expert keeps its name when a process holds
    only some of them). `exchange` moves tokens to the experts' processes and back."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int,
                 capacity_factor: float, aux_loss_coef: float, layer: int = -1):
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.capacity_factor, self.aux_loss_coef = capacity_factor, aux_loss_coef
        self.layer = layer                 # index in the flat layer list, for the records
        self.router = Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Expert(d_model, d_ff) for e in range(n_experts)})
        self.exchange = LOCAL
        self.last: Routing | None = None

    def route(self, x: torch.Tensor) -> Routing:
        return Routing(self.router(x).softmax(dim=-1), self.top_k, self.capacity_factor,
                       self.aux_loss_coef)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        r = self.last = self.route(x)
        if LOG is not None:
            LOG.append(("route", time.perf_counter(), self.layer,
                        r.routed.sum(0).tolist(), r.dropped.sum(0).tolist()))
        # The kept assignments, sorted by expert (stable: group, choice, token order within).
        token = torch.arange(b * s).view(b, 1, s).expand(b, self.top_k, s)
        keep = r.kept.reshape(-1)
        experts, order = torch.sort(r.expert.reshape(-1)[keep], stable=True)
        token = token.reshape(-1)[keep][order]
        gate = r.gate.reshape(-1)[keep][order]
        counts = torch.bincount(experts, minlength=self.n_experts)
        rows = x.reshape(b * s, d).index_select(0, token)
        out = self._experts(counts, rows)
        y = torch.zeros(b * s, d, dtype=x.dtype).index_add(0, token, out * gate.unsqueeze(-1))
        return attach_aux_loss(y.view(b, s, d), r.aux)

    def _experts(self, counts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert (`counts` per expert) -> each row through its expert, same order."""
        ex = self.exchange
        # received: per source process, a block for each local expert
        recv_counts, received, handle = ex.dispatch(counts, rows, self.layer)
        local = recv_counts.shape[1]
        first = ex.index * local
        starts = torch.cat([recv_counts.new_zeros(1), recv_counts.reshape(-1).cumsum(0)])
        # Gather each local expert's rows from every source, run it, put them back in place.
        blocks = [[(int(starts[src * local + j]), int(recv_counts[src, j]))
                   for src in range(recv_counts.shape[0])] for j in range(local)]
        perm = torch.cat([torch.arange(a, a + n) for per in blocks for a, n in per]
                         or [torch.zeros(0, dtype=torch.long)])
        sizes = [sum(n for _a, n in per) for per in blocks]
        start = time.perf_counter()
        done = torch.cat([self.experts[str(first + j)](part) for j, part
                          in enumerate(received.index_select(0, perm).split(sizes))])
        if LOG is not None:
            LOG.append(("experts", start, time.perf_counter(), self.layer, len(perm)))
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.numel())
        return ex.combine(done.index_select(0, back), handle, self.layer)


def moe_parameter_counts(d_model: int, d_ff: int, n_experts: int, top_k: int) -> tuple[int, int]:
    """(total, active per token) parameters of one MoE MLP: router + E experts, router + k."""
    expert = 2 * d_model * d_ff + d_ff + d_model
    return d_model * n_experts + n_experts * expert, d_model * n_experts + top_k * expert


def check_config(cfg) -> None:
    """ValueError naming the ModelConfig field and its rule (called by ModelConfig itself)."""
    n = cfg.n_experts
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"ModelConfig.n_experts must be None, 0 (dense MLPs) or a positive "
                         f"integer, got {n!r}")
    positive_int("ModelConfig.top_k", cfg.top_k)
    positive_number("ModelConfig.capacity_factor", cfg.capacity_factor,
                    "number (an expert takes ⌈capacity_factor · tokens · top_k / n_experts⌉ "
                    "tokens)")
    coef = cfg.aux_loss_coef
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0 <= coef < math.inf:
        raise ValueError(f"ModelConfig.aux_loss_coef must be a finite number >= 0, got {coef!r}")
    if n and cfg.top_k > n:
        raise ValueError(f"ModelConfig.top_k ({cfg.top_k}) must be at most n_experts ({n}): a "
                         f"token cannot go to more experts than there are")
