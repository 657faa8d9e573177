"""Memory in bytes, one model: activations by recomputation policy, parameters, optimizer state.

Derived from the toy model's own operations (gpt.py), in float32, for `rows` sequences of
`cfg.seq_len` tokens (one microbatch), and counted the way the runtime's saved-tensors meter
counts (runtime/meter.py): each storage an autograd node saves for backward, once; parameters
are not activations. The simulated byte curves (chapters/recomputation.py's `simulate_bytes`)
and the planner read these numbers; the tests check them against the meter, byte for byte
where they can.

One transformer block keeps, with t = rows·seq tokens, h = d_model, f = d_ff, a = heads:

    8·t·h  floats  its input, both LayerNorm outputs and inputs, q, k, v in head layout, the
                   attention output (the projection's input)
    2·t·f  floats  the MLP's hidden layer before and after GELU
    4·t    floats  the LayerNorms' means and inverse deviations
    a·rows·s²  floats  the attention probabilities, plus an s² byte causal mask

That is Korthikanti et al.'s s·b·h·(34 + 5·a·s/h) (16-bit, with dropout masks) redone for our
block: no dropout, float32, and s² terms that are softmax's output and the mask only.

Policies (recompute.py): `none` keeps all of it; `selective` drops the attention core's part
(q, k, v in head layout, the mask, the probabilities) and keeps the qkv output it is recomputed
from; `full` keeps only each block's input; `every-k` keeps every k-th block's input. What a
policy does not keep, the recomputation `R` materialises again before the backward.
"""
from __future__ import annotations

import math

from .config import ModelConfig, shard_rows
from .memory_rules import (FREES, FREES_BUT_STASH, FREES_STASH, FREES_SHARD, KEEPS, KEEPS_SHARD,
                           RESTORES)
from .memory_moe import moe_parameters, moe_saved, moe_stash

FLOAT = 4        # bytes of a float32
INDEX = 8        # bytes of an int64 token id or position
POLICIES = ("none", "full", "selective", "every-k")
# The parts of `block_saved` that belong to the attention core (model.AttentionCore).
CORE = ("q (head layout)", "k (head layout)", "causal mask", "attention probabilities",
        "v (head layout)")


# What tensor parallelism splits over its t shards (techniques/tensor.py): q, k, v and the
# probabilities of the shard's heads, the attention output it projects, its slice of the MLP's
# hidden layer. The rest (LayerNorms' inputs, outputs and statistics: the column-parallel
# Linears' inputs) every shard keeps whole.
TENSOR_SPLIT = ("q (head layout)", "k (head layout)", "attention probabilities",
                "v (head layout)", "proj input (attention output)", "GELU input",
                "down input (GELU output)")


def block_saved(cfg: ModelConfig, rows: int, tensor: int = 1, expert: int = 1) -> dict[str, int]:
    """Bytes one block's forward saves for its backward, by tensor (each storage once); with
    `tensor` > 1, on one of its tensor-parallel shards; a mixture-of-experts MLP (over `expert`
    processes) in place of the dense one: memory_moe's bound."""
    b, s, h, f, a = rows, cfg.seq_len, cfg.d_model, cfg.ffn_width, cfg.n_heads
    t = b * s
    saved = {
        "block input (LayerNorm 1's input)": t * h * FLOAT,
        "LayerNorm 1 mean, 1/std": 2 * t * FLOAT,
        "qkv input (LayerNorm 1's output)": t * h * FLOAT,
        "q (head layout)": t * h * FLOAT,
        "k (head layout)": t * h * FLOAT,
        "causal mask": s * s,                     # bool
        "attention probabilities": b * a * s * s * FLOAT,
        "v (head layout)": t * h * FLOAT,
        "proj input (attention output)": t * h * FLOAT,
        "LayerNorm 2 input": t * h * FLOAT,
        "LayerNorm 2 mean, 1/std": 2 * t * FLOAT,
        "up input (LayerNorm 2's output)": t * h * FLOAT,
        "GELU input": t * f * FLOAT,
        "down input (GELU output)": t * f * FLOAT,
    }
    if cfg.moe:
        del saved["GELU input"], saved["down input (GELU output)"]
        saved.update(moe_saved(cfg, rows, expert))
    return {k: v // tensor if k in TENSOR_SPLIT else v for k, v in saved.items()}


def block_bytes(cfg: ModelConfig, rows: int, policy: str = "none", tensor: int = 1,
                expert: int = 1) -> int:
    """Bytes one block keeps from its forward to its recomputation: `none` all of
    `block_saved`, `selective` all but the attention core plus the qkv output the core is
    recomputed from, `full` (and a checkpointed block of `every-k`) only its input."""
    saved = block_saved(cfg, rows, tensor, expert)
    if policy == "none":
        return sum(saved.values())
    if policy == "selective":
        qkv_output = 3 * rows * cfg.seq_len * cfg.d_model * FLOAT // tensor
        return sum(v for k, v in saved.items() if k not in CORE) + qkv_output
    if policy == "full":
        return saved["block input (LayerNorm 1's input)"]
    raise ValueError(f"policy must be one of {POLICIES[:3]} for one block, got {policy!r}")


def default_k(blocks: int) -> int:
    """Chen et al.'s checkpoint spacing for `blocks` blocks: the nearest whole number to √n."""
    return max(1, round(math.sqrt(blocks)))


def _blocks(cfg: ModelConfig, start: int, stop: int) -> int:
    return len(range(max(start, 1), min(stop, cfg.n_layers + 1)))


def _check_range(cfg: ModelConfig, start: int, stop: int) -> None:
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= cfg.total_layers):
        raise ValueError(f"layers: need 0 <= start < stop <= {cfg.total_layers} "
                         f"(embedding, {cfg.n_layers} blocks, head), got start={start!r}, stop={stop!r}")


def _check_rows(rows: int) -> None:
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be a whole number of sequences >= 1, got {rows!r}")


def _ends(cfg: ModelConfig, start: int, stop: int, rows: int, sharded: bool = False) -> int:
    """The embedding's and the head's saved bytes, where the layers hold them (never recomputed:
    the embedding keeps only token ids, the head and loss are one small layer). `sharded`
    (vocabulary parallelism, techniques/vocab_passes.py): the first stage adds positions to word
    vectors that arrive (it keeps the position ids only) and the last keeps its LayerNorm alone
    (input, mean, 1/std); the output layer's bytes are the vocabulary passes' (`vocab_bytes`)."""
    t, h, v = rows * cfg.seq_len, cfg.d_model, cfg.vocab_size
    total = 0
    if start == 0:           # token ids and positions, for the embedding's backward
        total += (0 if sharded else t * INDEX) + cfg.seq_len * INDEX
    if stop == cfg.total_layers and sharded:
        total += (t * h + 2 * t) * FLOAT
    elif stop == cfg.total_layers:
        total += (2 * t * h + 2 * t) * FLOAT       # LayerNorm input, mean, 1/std; its output
        total += t * v * FLOAT + t * INDEX + FLOAT  # log-softmax, targets, the loss's weight sum
    return total


def vocab_bytes(cfg: ModelConfig, rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """Vocabulary parallelism on `ranks` ranks, rank `rank`: (bytes of its vocabulary shard's
    parameters, bytes its S keeps for its T per microbatch). The shard holds V_r rows of the
    token table and of the output projection (one table when tied); S keeps its copy of X
    (t·h floats) and the shard's softmax (t·V_r floats), held in the meter until T."""
    first, stop = shard_rows(cfg.vocab_size, ranks, rank)
    t, h, tables = rows * cfg.seq_len, cfg.d_model, 1 if cfg.tie_embeddings else 2
    return tables * (stop - first) * h * FLOAT, (t * h + t * (stop - first)) * FLOAT


def activation_bytes(cfg: ModelConfig, start: int, stop: int, rows: int,
                     policy: str = "none", k: int | None = None, sharded: bool = False,
                     tensor: int = 1, expert: int = 1) -> int:
    """Bytes the layers [start, stop) keep alive for one microbatch of `rows` sequences between
    its forward and its backward (or its recomputation `R`, when `policy` is not `none`).

    `every-k` keeps the input of every k-th block of the range (blocks start, start+k, …);
    k defaults to `default_k` of the range's blocks. k=1 is `full`. `sharded`: the
    vocabulary is sharded over the ranks (`_ends`); `tensor`: on one of t tensor-parallel
    shards (`block_saved`)."""
    _check_range(cfg, start, stop)
    _check_rows(rows)
    k = check_policy(policy, k)
    n = _blocks(cfg, start, stop)
    if policy == "every-k":
        k = default_k(n) if k is None else k
        blocks = math.ceil(n / k) * block_bytes(cfg, rows, "full", tensor, expert) if n else 0
    else:
        blocks = n * block_bytes(cfg, rows, policy, tensor, expert)
    return blocks + _ends(cfg, start, stop, rows, sharded)


def recompute_bytes(cfg: ModelConfig, start: int, stop: int, rows: int,
                    policy: str = "none", k: int | None = None) -> int:
    """Bytes the recomputation `R` of one microbatch materialises again: what `none` keeps
    and `policy` does not (0 for `none`)."""
    return (activation_bytes(cfg, start, stop, rows, "none")
            - activation_bytes(cfg, start, stop, rows, policy, k))


def transient_bytes(cfg: ModelConfig, start: int, stop: int, rows: int,
                    policy: str = "none", k: int | None = None) -> int:
    """Bytes above `activation_bytes(..., "none")` for a moment inside `R`: under `selective`
    the last core's qkv output, still held while its recomputed q, k, v are saved (then let
    go); 0 for the other policies, whose checkpoints are saved again by the recomputation."""
    n = _blocks(cfg, start, stop)
    return 3 * rows * cfg.seq_len * cfg.d_model * FLOAT if policy == "selective" and n else 0


def input_grad_transient(cfg: ModelConfig, start: int, stop: int, rows: int) -> int:
    """Bytes above the start level for a moment inside `I`: the first Linear it reaches (the
    last block's `down`) stores the arriving output gradient for W before any saved tensor is
    let go. On the stage with the head, the loss's backward frees as much first: 0 there."""
    if stop == cfg.total_layers or not _blocks(cfg, start, stop):
        return 0
    return rows * cfg.seq_len * cfg.d_model * FLOAT


def weight_grad_bytes(cfg: ModelConfig, start: int, stop: int, rows: int,
                      sharded: bool = False, tensor: int = 1, expert: int = 1) -> int:
    """Bytes an input-gradient pass `I` leaves for its `W` (weight_grad.py): the input and
    output gradient of every Linear, each storage once — per block 8·t·h + 2·t·f floats, the
    head t·h + t·vocab. The same whatever the recomputation policy: `R` restored everything.
    On one of `tensor` shards the column-parallel Linears' output gradients and the
    row-parallel ones' inputs are split: per block 4·t·h + (4·t·h + 2·t·f)/tensor."""
    _check_range(cfg, start, stop)
    _check_rows(rows)
    t, h, f = rows * cfg.seq_len, cfg.d_model, cfg.ffn_width
    if cfg.moe:                      # attention's Linears, and the experts' (memory_moe)
        per_block = 6 * t * h * FLOAT + moe_stash(cfg, rows, expert)
    else:
        per_block = (4 * t * h + (4 * t * h + 2 * t * f) // tensor) * FLOAT
    total = _blocks(cfg, start, stop) * per_block
    if stop == cfg.total_layers and not sharded:     # sharded: the head has no Linear
        total += (t * h + t * cfg.vocab_size) * FLOAT
    return total


def _tied(cfg: ModelConfig, start: int, stop: int) -> bool:
    # build_layers ties the head to the embedding only when one slice holds both
    return cfg.tie_embeddings and start == 0 and stop == cfg.total_layers


def parameter_count(cfg: ModelConfig, start: int, stop: int, sharded: bool = False,
                    tensor: int = 1, expert: int = 1) -> int:
    """Parameters of the layers [start, stop) as `build_layers` makes them; `sharded`: without
    the token table and the output projection, which vocabulary parallelism cuts into shards
    (`vocab_bytes`): the position table and the final LayerNorm stay. `tensor`: on the first
    of t tensor-parallel shards (the fullest: the row-parallel biases are its alone)."""
    _check_range(cfg, start, stop)
    h, f, v, s = cfg.d_model, cfg.ffn_width, cfg.vocab_size, cfg.seq_len
    block = (3 * h * h + 3 * h + h * h + h * f + f + f * h) // tensor + 2 * h + 4 * h
    if cfg.moe:                      # the router and this process's experts, not up and down
        block += moe_parameters(cfg, expert)[0] - (2 * h * f + f + h)
    total = _blocks(cfg, start, stop) * block
    if start == 0:
        total += (0 if sharded else v * h) + s * h
    if stop == cfg.total_layers:
        total += 2 * h + (0 if sharded or _tied(cfg, start, stop) else v * h)
    return total


def parameter_bytes(cfg: ModelConfig, start: int, stop: int, sharded: bool = False,
                    tensor: int = 1, expert: int = 1) -> int:
    """Bytes of the float32 parameters of layers [start, stop) (their gradients take as many)."""
    return parameter_count(cfg, start, stop, sharded, tensor, expert) * FLOAT


def _parameter_tensors(cfg: ModelConfig, start: int, stop: int, sharded: bool = False,
                       expert: int = 1) -> int:
    per_block = 12                                    # 4 Linears and 2 LayerNorms, weight + bias
    if cfg.moe:
        per_block += moe_parameters(cfg, expert)[1] - 4
    tensors = per_block * _blocks(cfg, start, stop)
    tensors += (1 if sharded else 2) if start == 0 else 0   # token and position tables
    if stop == cfg.total_layers:
        tensors += 2 + (0 if sharded or _tied(cfg, start, stop) else 1)
    return tensors


def static_bytes(cfg: ModelConfig, bounds, stages_of, ranks: int, optimizer: str = "adamw",
                 vocab: bool = False, tensor: int = 1, expert: int = 1) -> list[int]:
    """Per rank: parameters, their gradients and the optimizer state of its stages
    (`stages_of(rank)`), and under vocabulary parallelism (`vocab`) its vocabulary shard's,
    whose AdamW state adds one step count per shard table."""
    per_stage = [2 * parameter_bytes(cfg, a, b, vocab, tensor, expert)
                 + optimizer_bytes(cfg, a, b, optimizer, vocab, tensor, expert) for a, b in bounds]
    out = [sum(per_stage[s] for s in stages_of(r)) for r in range(ranks)]
    if vocab:
        tables = 1 if cfg.tie_embeddings else 2
        for r in range(ranks):
            shard = vocab_bytes(cfg, 1, ranks, r)[0]
            out[r] += 2 * shard + (0 if optimizer == "sgd" else 2 * shard + FLOAT * tables)
    return out


def optimizer_bytes(cfg: ModelConfig, start: int, stop: int, optimizer: str = "adamw",
                    sharded: bool = False, tensor: int = 1, expert: int = 1) -> int:
    """Bytes of optimizer state for layers [start, stop): AdamW (what the runtime uses) keeps
    two float32 moments per parameter and a float32 step count per parameter tensor; plain
    SGD keeps nothing."""
    _check_range(cfg, start, stop)
    if optimizer == "sgd":
        return 0
    if optimizer != "adamw":
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    return (2 * parameter_bytes(cfg, start, stop, sharded, tensor, expert)
            + FLOAT * _parameter_tensors(cfg, start, stop, sharded, expert))


def check_policy(policy: str, k: int | None = None) -> int | None:
    """ValueError unless `policy` is one of POLICIES and `k` fits it; returns k."""
    if policy not in POLICIES:
        raise ValueError(f"recompute policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if k is not None:
        if policy != "every-k":
            raise ValueError(f"recompute k is only for policy 'every-k', got k={k!r} "
                             f"with policy {policy!r}")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"recompute k (keep every k-th block's input) must be a whole "
                             f"number >= 1, got {k!r}")
    return k


def action_bytes(cfg: ModelConfig, bounds, rows: int, policies=None,
                 vocab: bool = False, tensor: int = 1,
                 expert: int = 1) -> dict[str, list[tuple[int, int]]]:
    """Per byte rule (memory_rules), per stage: (bytes added at its start, bytes released at
    its end) by one microbatch's action following that rule — a forward keeps the policy's
    bytes, a recomputation restores the rest (and holds its transient), a full backward
    releases all, an input-gradient pass all but what it leaves the weight-gradient pass (with
    its own transient), that pass the rest. `policies`: one recompute.Policy (or None for
    `none`) per stage. `vocab`: the vocabulary is sharded over the ranks (one stage each): the
    shard's forward on stage r keeps rank r's `vocab_bytes`, its backward lets them go.
    `tensor`: on one of t tensor-parallel shards; `expert`: experts over that many processes
    (an MoE model's bytes are memory_moe's bound). Which kind follows which rule is the kind's
    spec (`Timeline.byte_rules()`)."""
    out: dict[str, list[tuple[int, int]]] = {rule: [] for rule in (KEEPS, RESTORES, FREES,
                                                                    FREES_BUT_STASH, FREES_STASH)}
    if vocab:
        kept = [vocab_bytes(cfg, rows, len(bounds), r)[1] for r in range(len(bounds))]
        out[KEEPS_SHARD], out[FREES_SHARD] = [(b, 0) for b in kept], [(0, b) for b in kept]
    for s, (start, stop) in enumerate(bounds):
        p = policies[s] if policies else None
        name, k = (p.name, p.k) if p is not None else ("none", None)
        full = activation_bytes(cfg, start, stop, rows, sharded=vocab, tensor=tensor,
                                expert=expert)
        kept = activation_bytes(cfg, start, stop, rows, name, k, vocab, tensor, expert)
        extra = transient_bytes(cfg, start, stop, rows, name, k)
        stash = weight_grad_bytes(cfg, start, stop, rows, vocab, tensor, expert)
        moment = input_grad_transient(cfg, start, stop, rows)
        out[KEEPS].append((kept, 0))
        out[RESTORES].append((full - kept + extra, extra))
        out[FREES].append((0, full))
        out[FREES_BUT_STASH].append((moment, full - stash + moment))
        out[FREES_STASH].append((0, stash))
    return out


def byte_curves(timeline, cfg: ModelConfig, bounds, rows: int,
                policies=None) -> dict[int, list[tuple[float, int]]]:
    """Live activation bytes per rank along a timeline's events (simulated, or measured: the
    model replayed in the order and at the times the run took), as step curves. Each kind
    follows its spec's byte rule (`timeline.byte_rules()`)."""
    table = action_bytes(cfg, bounds, rows, policies)
    effects = {kind: table[rule] for kind, rule in timeline.byte_rules().items() if rule in table}
    changes: dict[int, list[tuple[float, int]]] = {r: [] for r in range(timeline.ranks)}
    for e in timeline.events:
        for part in e.action.parts:
            if part.kind in effects:
                add, release = effects[part.kind][part.stage]
                changes[e.rank] += [(e.start, add), (e.end, -release)]
    curves = {}
    for rank, items in changes.items():
        # At one instant an action ending releases before the next one starting adds.
        level, curve = 0, [(0.0, 0)]
        for t, delta in sorted(items, key=lambda c: (c[0], c[1] >= 0)):
            if delta:
                level += delta
                curve.append((t, level))
        curves[rank] = curve
    return curves


def peak_bytes(timeline, cfg: ModelConfig, bounds, rows: int, policies=None) -> dict[int, int]:
    """The byte model's peak of live activations per rank along `timeline`."""
    return {r: max(level for _t, level in curve)
            for r, curve in byte_curves(timeline, cfg, bounds, rows, policies).items()}
