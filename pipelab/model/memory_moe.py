"""Bytes of a mixture-of-experts MLP (moe.py) for the byte model (memory.py): an upper bound.

What an MoE layer keeps depends on where the router sends the tokens, which no plan knows in
advance. The bound takes every expert full: per sequence of s tokens the layer keeps at most
min(k·s, E·C) assignments (C = ⌈c·s·k/E⌉, the capacity), and under expert parallelism over ep
processes a process's E/ep experts take at most C rows of every sequence of each of the ep
replicas' microbatches (ep·b·(E/ep)·C = b·E·C rows). A balanced router keeps a little less (the
capacity factor's slack); a skewed one drops tokens and keeps less still.

Saved per layer (float32 unless said): the router's softmax (twice: the probabilities and the
aux loss's term, t·E each), the choices (int64, t·k) and the keep mask (bool, b·k·s), the aux
loss's shares (2·b·E); on the token side per kept assignment three sort/gather indices, the
gather back and the scatter index (int64), its gate, the weighted and unweighted expert output
(2·h); on the expert side per row its input (h), the expert's hidden layer before and after
GELU (2·f) and its output (h).
"""
from __future__ import annotations

from .config import ModelConfig
from .moe import capacity

FLOAT, INDEX = 4, 8


def kept_rows(cfg: ModelConfig, rows: int, expert: int = 1) -> tuple[int, int]:
    """(token side, expert side): the most assignments one microbatch of `rows` sequences keeps,
    and the most rows one process's experts run (they serve all `expert` replicas)."""
    s, e, k = cfg.seq_len, cfg.n_experts, cfg.top_k
    per_expert = capacity(s, e, k, cfg.capacity_factor)
    mine = rows * min(k * s, e * per_expert)
    return mine, min(rows * e * per_expert, expert * mine)


def moe_saved(cfg: ModelConfig, rows: int, expert: int = 1) -> dict[str, int]:
    """Bytes one MoE MLP saves for its backward (the bound above), by what they are."""
    t, h, f, e, k = rows * cfg.seq_len, cfg.d_model, cfg.ffn_width, cfg.n_experts, cfg.top_k
    tokens, served = kept_rows(cfg, rows, expert)
    return {"router softmax (twice)": 2 * t * e * FLOAT,
            "choices, keep mask, aux shares": t * k * INDEX + rows * k * cfg.seq_len
            + 2 * rows * e * FLOAT,
            "assignments: indices, gate, outputs": tokens * (5 * INDEX + FLOAT + 2 * h * FLOAT),
            "expert rows: input, hidden, output": served * (2 * h + 2 * f) * FLOAT}


def moe_stash(cfg: ModelConfig, rows: int, expert: int = 1) -> int:
    """Bytes the weight-gradient store keeps from I to W for one MoE MLP: the router's input
    and output gradient, each expert Linear's input and output gradient (the bound above)."""
    t, h, f, e = rows * cfg.seq_len, cfg.d_model, cfg.ffn_width, cfg.n_experts
    return (t * h + t * e + kept_rows(cfg, rows, expert)[1] * (2 * h + 2 * f)) * FLOAT


def moe_parameters(cfg: ModelConfig, expert: int = 1) -> tuple[int, int]:
    """(parameters, parameter tensors) of one MoE MLP on a process holding E/`expert` experts:
    the router (replicated) and its experts' up and down Linears."""
    h, f, mine = cfg.d_model, cfg.ffn_width, cfg.n_experts // expert
    return h * cfg.n_experts + mine * (2 * h * f + f + h), 1 + 4 * mine
