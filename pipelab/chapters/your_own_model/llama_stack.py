"""A small LLaMA-style stack to bring to the laboratory as your own model (notebook 15).

    model = pl.CustomModel(layers="pipelab.chapters.your_own_model.llama_stack:layers",
                           loss="pipelab.chapters.your_own_model.llama_stack:loss",
                           batch="pipelab.chapters.your_own_model.llama_stack:batch")

Nothing of it is pipelab's GPT: a token embedding (no position table), BLOCKS pre-norm blocks of
RMSNorm → causal self-attention with rotary positions (RoPE: each head's query and key
pairs rotated by an angle growing with the position) → residual, RMSNorm → SwiGLU MLP
(silu(x·W₁) ⊙ x·W₃, then W₂) → residual, and an RMSNorm + Linear head onto the corpus's characters
(pipelab/model/data.py reads data/corpus.txt; nothing is downloaded). `heavy_layers` is the same
stack whose first block's MLP is HEAVY_WIDTH wide: a heavy first stage, for the lesson on
partitioning by measured cost. Weights come from a generator seeded by `seed` (the same on
every call, so every worker builds the same model); batches from `get_batch(..., seed=seed)`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...model.data import VOCAB_SIZE, get_batch

WIDTH, HEADS, SEQ, BLOCKS = 64, 4, 32, 6
MLP_WIDTH = 176                  # ≈ 8/3 × WIDTH, as LLaMA sizes its SwiGLU (rounded to 16)
HEAVY_WIDTH = 4096               # the heavy first block's MLP


class RMSNorm(nn.Module):
    """x / rms(x) × a learned gain (no mean subtracted, no bias)."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.gain, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain


def rotate(x, cos, sin):
    """RoPE on (batch, heads, seq, head_dim): the first and second halves of each head's
    features taken as pairs and rotated by the position's angles."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.out = nn.Linear(WIDTH, WIDTH, bias=False)
        half = WIDTH // HEADS // 2
        freq = 1.0 / 10000 ** (torch.arange(half) / half)
        angle = torch.arange(SEQ)[:, None] * freq[None, :]          # (seq, half)
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=-1))
        cos, sin = self.cos[:s], self.sin[:s]
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v,
                                           is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.gate = nn.Linear(WIDTH, hidden, bias=False)
        self.up = nn.Linear(WIDTH, hidden, bias=False)
        self.down = nn.Linear(hidden, WIDTH, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int = MLP_WIDTH):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(WIDTH), Attention()
        self.mlp_norm, self.mlp = RMSNorm(WIDTH), SwiGLU(hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(VOCAB_SIZE, WIDTH)

    def forward(self, ids):
        return self.table(ids)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.out = RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB_SIZE, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


def _build(seed: int, first_width: int) -> list[nn.Module]:
    layers = [Embed(), LlamaBlock(first_width), *(LlamaBlock() for _ in range(BLOCKS - 1)),
              Head()]
    gen = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():                  # drawn from our own generator: the same every call
        for layer in layers:
            for name, p in layer.named_parameters():
                if name.endswith("gain"):
                    continue               # RMSNorm gains start at 1
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return layers


def layers(seed: int) -> list[nn.Module]:
    """Embedding, BLOCKS LLaMA blocks, head: BLOCKS + 2 layers."""
    return _build(seed, MLP_WIDTH)


def heavy_layers(seed: int) -> list[nn.Module]:
    """The same stack with a HEAVY_WIDTH-wide MLP in the first block."""
    return _build(seed, HEAVY_WIDTH)


def loss(output, targets):
    """Mean next-character cross-entropy."""
    return F.cross_entropy(output.reshape(-1, VOCAB_SIZE), targets.reshape(-1))


def batch(batch_size: int, seed: int):
    """`batch_size` windows of SEQ characters of the corpus and their next characters."""
    return get_batch(batch_size, SEQ, seed=seed)
