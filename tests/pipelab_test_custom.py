"""A model nobody in pipelab wrote, for tests/test_custom_model.py: the workers import it by name.

Integer token inputs; an embedding that returns a tuple (hidden states, the token ids carried
along as an integer tensor); a residual MLP layer that reads both; a parameter-free activation
layer; a LayerNorm head (its gradient stays fused with the input gradient under I/W splits).
Loss: mean cross-entropy of the next token. Tiny, so a run takes milliseconds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, SEQ = 11, 8, 4


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(VOCAB, WIDTH)

    def forward(self, ids):
        return self.table(ids), ids            # a tuple, one of its tensors integer


class Mix(nn.Module):
    """x + W·x, plus an embedding of the ids again (reads both parts of the tuple)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, pair):
        x, ids = pair
        return x + self.fc(x) + 0.1 * (ids.float().unsqueeze(-1) / VOCAB), ids


class Act(nn.Module):
    """No parameters: tanh on the hidden part, ids passed on."""

    def forward(self, pair):
        x, ids = pair
        return torch.tanh(x), ids


class Drop(nn.Module):
    """Leaves the ids behind: one float tensor from here on."""

    def forward(self, pair):
        return pair[0]


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


def layers(seed):
    torch.manual_seed(1000 + seed)             # every call builds the same weights
    return [Embed(), Mix(), Act(), Mix(), Act(), Drop(), nn.Linear(WIDTH, WIDTH), Head()]


def loss(output, targets):
    return F.cross_entropy(output.reshape(-1, VOCAB), targets.reshape(-1))


def batch(batch_size, seed):
    """A learnable task: each token's target is the next one in a cycle of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(VOCAB, (batch_size, 1), generator=g)
    ids = (start + torch.arange(SEQ)) % VOCAB
    return ids, (ids + 1) % VOCAB


# --- broken variants, each refused before any worker starts -------------------------------------
def two_layers(seed):
    return layers(seed)[:1] + [nn.Sequential(*layers(seed)[1:])]


def vector_loss(output, targets):
    return F.cross_entropy(output.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")


def not_modules(seed):
    return [lambda x: x]
