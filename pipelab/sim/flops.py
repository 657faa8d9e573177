"""The arithmetic of a GPT layer at real scale: FLOPs per pass and bytes kept, closed forms.

One microbatch of b sequences of s tokens, hidden size h, MLP width f (4h unless given), a
attention heads, vocabulary V, tensor-parallel size t. A matmul of (n×k)·(k×m) costs 2nkm FLOPs.

FLOPs (docs/formulas.md, "Costs from a model shape", derives each):

    a block's Linears    2bs(4h² + 2hf)  = 24bsh² at f = 4h   (QKV 3h², projection h², MLP 2hf)
    attention's core     4bs²h           (QKᵀ and the weighted sum of V, 2bs²h each)
    forward   F = linear + core                       = bsh(24h + 4s)
    input-gradient  I = linear + 2·core               = bsh(24h + 8s)
    weight-gradient W = linear                        = 24bsh²
    output layer    F = I = W = 2bshV                 (one Linear h → V)

A Linear's backward is two matmuls of its forward's size, one for the input gradient (I), one
for the weight gradient (W); attention's core has no weights, so its backward (two gradients per
product) is all I. These are the zero-bubble paper's Table 1 counts.

Activation bytes one block keeps for its backward, 16-bit with dropout masks (Korthikanti et al.
2022, arXiv 2205.05198, §4): sbh(34 + 5as/h) without parallelism; tensor parallelism alone
sbh(10 + 24/t + 5as/(ht)); with sequence parallelism (sbh/t)(34 + 5as/h). Selective
recomputation drops the core's 5as²b bytes (34sbh, or 34sbh/t with sequence parallelism, or
sbh(10 + 24/t) without); full recomputation keeps the block's input, 2sbh (2sbh/t with sequence
parallelism).
"""
from __future__ import annotations

RECOMPUTE_POLICIES = ("none", "selective", "full")


def linear_flops(hidden: int, seq_len: int, microbatch: int, ffn: int | None = None) -> float:
    """FLOPs of one pass (forward, or input-gradient, or weight-gradient) of a block's Linears."""
    h, f = hidden, ffn if ffn is not None else 4 * hidden
    return 2 * microbatch * seq_len * (4 * h * h + 2 * h * f)


def attention_flops(hidden: int, seq_len: int, microbatch: int) -> float:
    """FLOPs of attention's core forward: QKᵀ and the weighted sum, 2bs²h each (the causal
    mask is not exploited, as Megatron's unfused kernels do not)."""
    return 4 * microbatch * seq_len * seq_len * hidden


def layer_flops(hidden: int, seq_len: int, microbatch: int,
                ffn: int | None = None) -> tuple[float, float, float]:
    """(F, I, W) FLOPs of one transformer block for one microbatch."""
    linear = linear_flops(hidden, seq_len, microbatch, ffn)
    core = attention_flops(hidden, seq_len, microbatch)
    return linear + core, linear + 2 * core, linear


def head_flops(hidden: int, seq_len: int, microbatch: int, vocab: int) -> tuple[float, float, float]:
    """(F, I, W) FLOPs of the output layer (h → V) for one microbatch: 2bshV each."""
    one = 2 * microbatch * seq_len * hidden * vocab
    return one, one, one


def recompute_flops(hidden: int, seq_len: int, microbatch: int, policy: str,
                    ffn: int | None = None) -> float:
    """FLOPs one block repeats before its backward: its attention core's forward (selective),
    its whole forward (full), nothing (none)."""
    if policy == "none":
        return 0.0
    if policy == "selective":
        return attention_flops(hidden, seq_len, microbatch)
    if policy == "full":
        return layer_flops(hidden, seq_len, microbatch, ffn)[0]
    raise ValueError(f"recompute must be one of {RECOMPUTE_POLICIES}, got {policy!r}")


def model_flops(hidden: int, layers: int, seq_len: int, vocab: int, microbatch: int,
                ffn: int | None = None) -> float:
    """FLOPs of one microbatch's forward and backward through the whole model (blocks and the
    output layer; the embedding is a lookup): what MFU counts, no recomputation."""
    return layers * sum(layer_flops(hidden, seq_len, microbatch, ffn)) \
        + sum(head_flops(hidden, seq_len, microbatch, vocab))


def layer_activation_bytes(hidden: int, heads: int, seq_len: int, microbatch: int,
                           tensor: int = 1, sequence_parallel: bool = True,
                           recompute: str = "none") -> float:
    """Bytes one block keeps between its forward and its backward (Korthikanti et al. 2022)."""
    s, b, h, a, t = seq_len, microbatch, hidden, heads, tensor
    sbh = s * b * h
    split = t if sequence_parallel else 1       # what sequence parallelism also splits
    if recompute == "full":
        return 2 * sbh / split
    core = 5 * a * s / h                         # the s² part: scores, softmax, its dropout mask
    if recompute == "selective":
        core = 0.0
    elif recompute != "none":
        raise ValueError(f"recompute must be one of {RECOMPUTE_POLICIES}, got {recompute!r}")
    if sequence_parallel or t == 1:
        return sbh / t * (34 + core)
    return sbh * (10 + 24 / t + core / t)


def layer_parameters(hidden: int, ffn: int | None = None, tensor: int = 1) -> float:
    """Parameters of one block on one of t tensor-parallel shards: QKV and projection 4h² + 4h,
    the MLP 2hf + f + h (split over t, but the row-parallel biases), two LayerNorms 4h."""
    h, f = hidden, ffn if ffn is not None else 4 * hidden
    return (4 * h * h + 3 * h + 2 * h * f + f) / tensor + 2 * h + 4 * h
