"""A toy decoder-only GPT, exposed as a flat list of layers so a pipeline stage is a slice.

Layer 0 is the embedding, layers 1..n_layers are transformer blocks, the last layer is the
head (final LayerNorm + projection to the vocabulary). Every layer initialises itself from its
own random generator seeded by (config seed, layer index): a stage built alone on another
process gets exactly the weights the same layers have in the full model.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import MAX_LAYERS, at_most
from .config import LAYER_SEED_STRIDE, ModelConfig, shard_rows  # noqa: F401  (pl.ModelConfig)
from .footprint import check_build
from .moe import MoEMLP, moe_parameter_counts
from .weight_grad import Linear


def _layer_generator(cfg: ModelConfig, index: int) -> torch.Generator:
    # A per-layer stream makes weights independent of which other layers are built.
    return torch.Generator().manual_seed(cfg.seed * LAYER_SEED_STRIDE + index)


def _init_params(module: nn.Module, gen: torch.Generator, std: float = 0.02) -> None:
    """GPT-2 style init: N(0, std) weights, zero biases, LayerNorm as identity."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()


class Embedding(nn.Module):
    """Token + position embedding: (batch, seq) token ids -> (batch, seq, d_model)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.seq_len = cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.seq_len:
            raise ValueError(f"a sequence of {idx.shape[1]} tokens is longer than "
                             f"ModelConfig.seq_len ({self.seq_len})")
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class AttentionCore(nn.Module):
    """Causal self-attention without its projections: scores, softmax, weighted sum of values.

    (batch, seq, 3·d_model) queries, keys and values side by side -> (batch, seq, d_model). It
    has no parameters, and what it saves for backward (q, k, v in head layout, the causal mask,
    the attention probabilities: O(heads·seq²) per sequence) is cheap to compute again — the part
    selective recomputation drops (recompute.py). A module of its own so it can be found there."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, d3 = qkv.shape
        d = d3 // 3
        q, k, v = qkv.split(d, dim=2)
        # (b, heads, s, head_dim)
        q, k, v = (t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=qkv.device).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return (weights @ v).transpose(1, 2).reshape(b, s, d)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)).

    Its Linears (and the head's) are `weight_grad.Linear`: nn.Linear whose weight gradient a
    pipeline's `I` pass can leave to a later `W` pass; outside that they are plain nn.Linear."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model)
        self.core = AttentionCore(cfg.n_heads)
        self.proj = Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.moe = None
        if cfg.moe:
            self.moe = MoEMLP(cfg.d_model, cfg.ffn_width, cfg.n_experts, cfg.top_k,
                              cfg.capacity_factor, cfg.aux_loss_coef)
        else:
            self.up = Linear(cfg.d_model, cfg.ffn_width)
            self.down = Linear(cfg.ffn_width, cfg.d_model)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(x)
        return self.down(F.gelu(self.up(x)))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.core(self.qkv(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and projection to vocabulary logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def build_layer(cfg: ModelConfig, index: int) -> nn.Module:
    """Layer `index` of the flat list (0 = embedding, last = head), deterministically initialised."""
    if not 0 <= index < cfg.total_layers:
        raise ValueError(f"layer index must be in [0, {cfg.total_layers}), got {index}")
    check_build(cfg, index, index + 1)
    if index == 0:
        layer = Embedding(cfg)
    elif index == cfg.total_layers - 1:
        layer = Head(cfg)
    else:
        layer = Block(cfg)
        if layer.moe is not None:
            layer.moe.layer = index
    _init_params(layer, _layer_generator(cfg, index))
    return layer


def build_layers(cfg: ModelConfig, start: int, stop: int) -> nn.Sequential:
    """Layers [start, stop) of the flat list, with the same weights they have in ToyGPT(cfg).

    With tie_embeddings, the head shares the embedding's weight when the slice holds both."""
    if not 0 <= start < stop <= cfg.total_layers:
        raise ValueError(f"need 0 <= start < stop <= {cfg.total_layers}, got start={start}, stop={stop}")
    check_build(cfg, start, stop)            # in microseconds, before the first allocation
    layers = nn.Sequential(*(build_layer(cfg, i) for i in range(start, stop)))
    if cfg.tie_embeddings and start == 0 and stop == cfg.total_layers:
        layers[-1].out.weight = layers[0].tok.weight
    return layers


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the (micro)batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ToyGPT(nn.Module):
    """The unsplit model: `self.layers` is the flat list embedding, blocks..., head."""

    def __init__(self, cfg: ModelConfig):
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"ToyGPT(cfg): cfg must be a pl.ModelConfig, got "
                             f"{type(cfg).__name__} {cfg!r:.60}")
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(build_layers(cfg, 0, cfg.total_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = idx
        for layer in self.layers:
            x = layer(x)
        return x

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(self(idx), targets)

    def layer_costs(self, batch_size: int = 1) -> list[dict]:
        return layer_costs(self.cfg, batch_size)


def layer_costs(cfg: ModelConfig, batch_size: int = 1) -> list[dict]:
    """Per layer of the flat list: name, kind, parameter count and forward FLOPs for a batch.

    Block FLOPs follow the zero-bubble paper's count, s·b·h·(24h + 4s) for d_ff = 4h
    (2 FLOPs per multiply-add in every matmul, plus QK^T and attention·V).
    """
    at_most("the model's layers (n_layers + 2)", cfg.total_layers, MAX_LAYERS,
            "the table has a row per layer")
    s, b, h, f, v = cfg.seq_len, batch_size, cfg.d_model, cfg.ffn_width, cfg.vocab_size
    block_params = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h   # qkv, proj, up, down, two LNs
    mlp_flops = 2 * s * b * 2 * h * f
    if cfg.moe:        # the router and E experts held; the router and k experts run per token
        total, _active = moe_parameter_counts(h, f, cfg.n_experts, cfg.top_k)
        block_params += total - (2 * h * f + f + h)
        mlp_flops = 2 * s * b * (h * cfg.n_experts + cfg.top_k * 2 * h * f)
    rows = [dict(index=0, name="embedding", kind="embedding",
                 params=(v + s) * h, flops=s * b * h)]
    for i in range(cfg.n_layers):
        matmul = 2 * s * b * 4 * h * h + mlp_flops
        attention = 4 * b * s * s * h
        rows.append(dict(index=i + 1, name=f"block {i + 1}", kind="block",
                         params=block_params, flops=matmul + attention))
    head_params = 2 * h + (0 if cfg.tie_embeddings else v * h)
    rows.append(dict(index=cfg.total_layers - 1, name="head", kind="head",
                     params=head_params, flops=2 * s * b * h * v))
    return rows
