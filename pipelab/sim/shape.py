"""Costs from a real model shape: what the papers' GPTs cost per stage on a named device.

    costs = pl.Costs.from_shape(hidden=3072, layers=32, heads=24, seq_len=4096, vocab=256_000,
                                microbatch=1, stages=8, device=pl.Device.named("A100-80GB"))
    prof  = pl.shape_profile(pl.ModelShape(3072, 32, 24, 4096, 256_000), microbatch=1, stages=8)
    pl.Costs.per_stage(**prof.table), prof.activation_bytes, prof.static_bytes

(`Costs.from_shape` is `Costs.per_stage(**shape_table(...))`: this module builds the table as
plain arguments, so it sits below costs.py and the cost model imports it, not the reverse.)

A per-stage table (`scope="stage"`): stage k holds `layers_per_stage[k]` blocks, the embedding
on the first stage and the output layer on the last — or, for the vocabulary schedules
(`vocab_schedule="vocab-1"|"vocab-2"`), the vocabulary passes S, T, their barriers and the
embedding's collectives on every rank (`kinds`). Times are FLOPs (flops.py) at the device's
peak × efficiency; the output layer's softmax and cross-entropy also stream their fp32 logits
through memory (`HEAD_PASSES`). Communication: one bf16 activation per point-to-point message
on the pipeline link (`comm`), and per pass of a stage its blocks' tensor-parallel all-reduces
(`tp_allreduce`, two per block) on the tensor link. Recomputation runs just before a backward,
so its FLOPs are charged to I. Memory per stage: parameters, gradients and optimizer state
(`bytes_per_parameter`: 18 a parameter, or 6 + 12/dp with `optimizer="zero-1"`), and one
microbatch's activations (Korthikanti et al.'s byte model).

Links: every message and all-reduce is on the device's pipeline link unless the profile is told
that the pipeline's messages (`pipeline_inter_node`) or the data-parallel ring
(`data_inter_node`) cross nodes; those then pay the device's inter-node link (the planner
decides which do, planner/shaped.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import boolean, positive_int
from .device import Device
from .flops import (RECOMPUTE_POLICIES, head_flops, layer_activation_bytes, layer_flops,
                    layer_parameters, model_flops, recompute_flops)

VOCAB_SCHEDULES = ("vocab-1", "vocab-2")
# Whose vocabulary passes a schedule runs: V-Half's (one barrier) are Vocab-2's.
VOCAB_PASSES = {"vocab-1": "vocab-1", "vocab-2": "vocab-2", "v-half-vocab": "vocab-2"}
# Mixed-precision Adam as Megatron keeps it: bf16 weights (2), fp32 gradients (4), fp32 master
# weights (4) and two fp32 moments (8) — Rajbhandari et al. (ZeRO, 2020) count 16, their
# gradients in fp16 (2). Megatron's distributed optimizer (ZeRO-1) shards the master weights
# and moments over the data-parallel replicas: 6 + 12/dp (Megatron-LM's docs, "Distributed
# Optimizer", table for bf16 parameters with fp32 gradients).
BYTES_PER_PARAMETER = 18
WEIGHT_AND_GRADIENT = 6        # bf16 weights + fp32 gradients: what every replica keeps whole
OPTIMIZER_STATE = 12           # fp32 master weights + Adam's two moments: what ZeRO-1 shards
OPTIMIZERS = ("adamw", "zero-1")
ACTIVATION = 2            # bytes per element sent between stages (bf16)
LOGIT = 4                 # the output layer's logits and softmax are fp32 (Megatron, the vocab code)
# Passes over the b·s·V fp32 logits that softmax cross-entropy makes (write the logits; read
# for the max, the exponentials and their sum; write the softmax), and its backward (read the
# softmax, write the gradient): an estimate of the memory traffic, not a measurement.
HEAD_PASSES = (3, 2)


@dataclass(frozen=True)
class ModelShape:
    """A GPT's shape: `hidden` size, `layers` (transformer blocks), attention `heads`,
    `seq_len`, `vocab` (untied input and output tables) and the MLP width `ffn` (4·hidden)."""
    hidden: int
    layers: int
    heads: int
    seq_len: int
    vocab: int
    ffn: int | None = None

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "seq_len", "vocab"):
            positive_int(name, getattr(self, name))
        if self.ffn is not None:
            positive_int("ffn", self.ffn)
        if self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden}): each "
                             f"head gets hidden/heads dimensions")

    @property
    def parameters(self) -> float:
        """Parameters of the whole model: blocks, token and position tables, the output layer
        and the final LayerNorm."""
        h = self.hidden
        return self.layers * layer_parameters(h, self.ffn) + (2 * self.vocab + self.seq_len) * h \
            + 2 * h


@dataclass
class StageProfile:
    """What `shape_profile` derives, per stage index: the cost table (`Costs.per_stage`'s
    arguments), the blocks each stage
    holds, and its bytes — `activation_bytes` (one microbatch's, kept from F to backward),
    `static_bytes` (parameters, gradients, optimizer state), `shard_bytes` (what a vocabulary
    pass S keeps for its T, on every rank; 0 without vocabulary parallelism)."""
    table: dict
    layers_per_stage: list[float]
    activation_bytes: list[float]
    static_bytes: list[float]
    shard_bytes: float = 0.0
    flops_per_microbatch: float = 0.0       # forward + backward of the whole model (MFU's count)
    device: Device | None = None
    tensor_parallel: int = 1                # shards of each stage (MFU counts every device)


def bytes_per_parameter(optimizer: str = "adamw", data_parallel: int = 1) -> float:
    """Static bytes a parameter keeps: 18 for mixed-precision Adam ("adamw"), 6 + 12/dp when
    the optimizer state is sharded over `data_parallel` replicas ("zero-1")."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS} ('adamw': every replica "
                         f"keeps Adam's state, 18 bytes a parameter; 'zero-1': the distributed "
                         f"optimizer, 6 + 12/dp), got {optimizer!r}")
    positive_int("data_parallel", data_parallel)
    if optimizer == "adamw":
        return float(BYTES_PER_PARAMETER)
    return WEIGHT_AND_GRADIENT + OPTIMIZER_STATE / data_parallel


def gradient_traffic(optimizer: str = "adamw") -> float:
    """Bytes a parameter the data-parallel collective moves, as a ring all-reduce of this
    many bytes would: Adam all-reduces its fp32 gradients (4); ZeRO-1 reduce-scatters them
    (4·(n−1)/n) and all-gathers the updated bf16 weights (2·(n−1)/n), 6·(n−1)/n in all — an
    all-reduce's 2·(n−1)/n of 3 bytes."""
    return 4.0 if optimizer == "adamw" else 3.0


def check_vocabulary_costs(schedule, costs) -> None:
    """Refuse to simulate a vocabulary schedule on costs in seconds that give its vocabulary
    passes no time (a shape's costs made without `vocab_schedule=`): the head would stay whole
    on the last stage and the passes S and T cost nothing — 1F1B's makespan, silently."""
    name = getattr(schedule, "name", "").split(" ")[0]
    if name not in VOCAB_PASSES or costs.unit != "s" or costs.per_action is not None:
        return
    if not {"S", "T"} & set(costs.kinds):
        raise ValueError(
            f"schedule {name!r} shards the output layer into vocabulary passes S and T, but "
            f"these costs (in seconds) give them no time: make the costs with "
            f"vocab_schedule={VOCAB_PASSES[name]!r} (pl.Costs.from_shape(..., vocab_schedule="
            f"...), or sim/scale.simulate_shape), or give kinds={{'S': ..., 'T': ...}}")


def default_layers(layers: int, stages: int, ends: bool = True) -> list[int]:
    """Blocks per stage, as even as whole blocks allow; the remainder goes to the middle
    stages first, so the first and last stages (which hold the embedding and the output layer)
    get one block fewer — the zero-bubble code's layout for layers = k·stages − 2."""
    base, extra = divmod(layers, stages)
    order = list(range(1, stages - 1)) + [0, stages - 1] if ends and stages > 2 \
        else list(range(stages))
    out = [base] * stages
    for k in order[:extra]:
        out[k] += 1
    return out


def _check_layout(layers_per_stage, shape: ModelShape, stages: int, vocab: bool) -> list[float]:
    if layers_per_stage is None:
        need = stages if vocab else stages - 2
        if shape.layers < need:
            raise ValueError(
                f"layers ({shape.layers}) must be >= stages ({stages})"
                f"{'' if vocab else ' - 2'}: every stage needs a block"
                f"{'' if vocab else ', except that the first and last may hold only the embedding and the output layer'}")
        return [float(n) for n in default_layers(shape.layers, stages, ends=not vocab)]
    items = list(layers_per_stage)
    if len(items) != stages or not all(isinstance(n, (int, float)) and not isinstance(n, bool)
                                       and n >= 0 for n in items):
        raise ValueError(f"layers_per_stage must give a number >= 0 of blocks for each of the "
                         f"{stages} stages, got {layers_per_stage!r}")
    if abs(sum(items) - shape.layers) > 1e-9:
        raise ValueError(f"layers_per_stage must add up to layers ({shape.layers}), "
                         f"got {sum(items)} from {items}")
    return [float(n) for n in items]


def shape_profile(shape: ModelShape, microbatch: int, stages: int, device: Device | None = None,
                  tensor_parallel: int = 1, recompute: str | None = None,
                  vocab_schedule: str | None = None, layers_per_stage=None,
                  sequence_parallel: bool = True, ranks: int | None = None,
                  optimizer: str = "adamw", data_parallel: int = 1,
                  pipeline_inter_node: bool = False,
                  data_inter_node: bool = False) -> StageProfile:
    """Per-stage costs and bytes of `shape` cut into `stages` on `device` (see the module's
    docstring). `ranks` (default `stages`) is how many processes share the vocabulary under a
    vocabulary schedule; `optimizer` and `data_parallel` set the static bytes
    (`bytes_per_parameter`) and the data-parallel collective's traffic; `pipeline_inter_node`
    and `data_inter_node` put the pipeline's messages and the data-parallel ring on the
    device's link between nodes."""
    if not isinstance(shape, ModelShape):
        raise ValueError(f"shape must be a pl.ModelShape, got {type(shape).__name__}")
    boolean("sequence_parallel", sequence_parallel)
    positive_int("microbatch", microbatch)
    positive_int("stages", stages)
    positive_int("tensor_parallel", tensor_parallel)
    device = Device.named("A100-40GB") if device is None else device
    if not isinstance(device, Device):
        raise ValueError(f"device must be a pl.Device (e.g. pl.Device.named('A100-80GB')), "
                         f"got {type(device).__name__}")
    policy = "none" if recompute is None else recompute
    if policy not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute must be None or one of {RECOMPUTE_POLICIES}, got {recompute!r}")
    if vocab_schedule not in (None,) + VOCAB_SCHEDULES:
        raise ValueError(f"vocab_schedule must be None or one of {VOCAB_SCHEDULES}, "
                         f"got {vocab_schedule!r}")
    t = tensor_parallel
    if shape.heads % t or shape.hidden % t:
        raise ValueError(f"tensor_parallel ({t}) must divide heads ({shape.heads}) and hidden "
                         f"({shape.hidden}): each shard holds whole heads")
    ranks = stages if ranks is None else positive_int("ranks", ranks)
    per_parameter = bytes_per_parameter(optimizer, data_parallel)
    for name, value in (("pipeline_inter_node", pipeline_inter_node),
                        ("data_inter_node", data_inter_node)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    vocab = vocab_schedule is not None
    layout = _check_layout(layers_per_stage, shape, stages, vocab)

    h, s, b, V, f = shape.hidden, shape.seq_len, microbatch, shape.vocab, shape.ffn
    secs = device.compute_time
    lf, li, lw = (x / t for x in layer_flops(h, s, b, f))
    lr = recompute_flops(h, s, b, policy, f) / t
    hf, hi, hw = (x / t for x in head_flops(h, s, b, V))
    logits = b * s * V * LOGIT / t
    head_fwd = secs(hf) + device.memory_time(HEAD_PASSES[0] * logits)
    head_bwd_i = secs(hi) + device.memory_time(HEAD_PASSES[1] * logits)
    block_f, block_i, block_w = secs(lf), secs(li + lr), secs(lw)   # one block's passes
    F = [n * block_f for n in layout]
    I = [n * block_i for n in layout]
    W = [n * block_w for n in layout]
    if not vocab:               # the output layer on the last stage
        F[-1] += head_fwd
        I[-1] += head_bwd_i
        W[-1] += secs(hw)
    message = b * s * h * ACTIVATION / (t if sequence_parallel else 1)
    block_tp = device.allreduce_time(b * s * h * ACTIVATION, t, tensor=True)
    tp = [n * 2 * block_tp for n in layout]
    kinds = _vocab_kinds(shape, b, t, ranks, device, vocab_schedule,
                         pipeline_inter_node) if vocab else {}

    per_layer = layer_parameters(h, f, t)
    shard_table = V * h / t                               # one vocabulary table, on one TP shard
    params = [n * per_layer for n in layout]
    if vocab:
        # a shard of each table on every rank: on its first stage (stage r is on rank r for
        # one stage per rank and for the V placement alike)
        params = [p + (2 * shard_table / ranks if k < ranks else 0.0)
                  for k, p in enumerate(params)]
        params[0] += s * h                                # positions stay on the first stage
    else:
        params[0] += shard_table + s * h
        params[-1] += shard_table + 2 * h
    act_layer = layer_activation_bytes(h, shape.heads, s, b, t, sequence_parallel, policy)
    acts = [n * act_layer for n in layout]
    if not vocab:               # the output layer keeps its input and the fp32 softmax
        acts[-1] += b * s * h * ACTIVATION + logits
    shard = (b * s * h + b * s * V / (ranks * t)) * LOGIT if vocab else 0.0
    latency, bandwidth = device.link(data_inter_node)       # the data-parallel ring's
    table = dict(F=F, I=I, W=W, comm=device.p2p_time(message, pipeline_inter_node), unit="s",
                 tp_allreduce=tp if t > 1 else 0.0, kinds=kinds,
                 parameter_bytes=[p * gradient_traffic(optimizer) for p in params],
                 bandwidth=bandwidth, latency=latency)
    return StageProfile(table, layout, acts, [p * per_parameter for p in params], shard,
                        model_flops(h, shape.layers, s, V, b, f), device, t)


def _vocab_kinds(shape: ModelShape, b: int, t: int, ranks: int, device: Device,
                 schedule: str, inter_node: bool = False) -> dict[str, float]:
    """Costs of the vocabulary passes on one of `ranks` shards (schedules/vocab.py's kinds).
    S: the shard's logits (2bshV/p), and under Vocab-2 also P_r·W_r for the fused barrier;
    T: dW_r, and under Vocab-1 also dX_r; both stream the shard's fp32 logits (HEAD_PASSES).
    Barriers are ring all-reduces over the ranks, in fp32 as the authors' code sends them:
    C0 a max then the sum and target logit (1, then 2 floats a token), C1 the input gradient
    (h a token), Vocab-2's fused C the max then 2 + 2h floats a token. The embedding's Vf and
    Vb each all-reduce one bf16 activation."""
    h, s, V = shape.hidden, shape.seq_len, shape.vocab
    tokens = b * s
    gemm = 2 * tokens * h * V / ranks / t
    logits = tokens * V / ranks * LOGIT / t
    two = schedule == "vocab-2"

    def reduce(nbytes: float) -> float:
        return device.allreduce_time(nbytes, ranks, inter_node=inter_node)

    return {"S": device.compute_time(gemm * (2 if two else 1))
            + device.memory_time(HEAD_PASSES[0] * logits),
            "T": device.compute_time(gemm * (1 if two else 2))
            + device.memory_time(HEAD_PASSES[1] * logits),
            "Cs": reduce(tokens * LOGIT) + reduce(2 * tokens * LOGIT),
            "Ct": reduce(tokens * h * LOGIT),
            "C": reduce(tokens * LOGIT) + reduce(tokens * (2 + 2 * h) * LOGIT),
            "Vf": reduce(tokens * h * ACTIVATION), "Vb": reduce(tokens * h * ACTIVATION)}


def shape_table(hidden: int, layers: int, heads: int, seq_len: int, vocab: int, microbatch: int,
                stages: int, device: Device | None = None, tensor_parallel: int = 1,
                recompute: str | None = None, vocab_schedule: str | None = None,
                layers_per_stage=None, ffn: int | None = None,
                sequence_parallel: bool = True, optimizer: str = "adamw",
                data_parallel: int = 1) -> dict:
    """`pl.Costs.from_shape`'s table: `Costs.per_stage` arguments for a GPT of this shape cut
    into `stages` (the device defaults to an A100-40GB). `shape_profile` gives its bytes too;
    `optimizer="zero-1"` over `data_parallel` replicas moves 3 bytes a parameter's worth of
    all-reduce (`gradient_traffic`) instead of 4."""
    shape = ModelShape(hidden, layers, heads, seq_len, vocab, ffn)
    return shape_profile(shape, microbatch, stages, device, tensor_parallel, recompute,
                         vocab_schedule, layers_per_stage, sequence_parallel,
                         optimizer=optimizer, data_parallel=data_parallel).table
