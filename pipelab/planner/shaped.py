"""The planner's source for a `pl.ModelShape` on a `pl.Device`: a real model's per-stage costs
and bytes from closed forms (sim/shape.py), in place of a CPU calibration.

Costs: `shape_profile` — FLOPs at the device's peak × efficiency, the tensor-parallel
all-reduces on its tensor link, point-to-point messages and the data-parallel gradient
all-reduce (the simulator's ring over `replicas`) on its pipeline link. Recomputation's FLOPs
are charged to the input-gradient pass I (no separate R action), as shape.py charges them.

Bytes: static — parameters, gradients and optimizer state, 18 bytes a parameter (mixed
precision Adam: bf16 weights, fp32 gradients, fp32 master weights and two moments) or, with
`optimizer="zero-1"` (Megatron's distributed optimizer), 6 + 12/dp, of each stage a rank holds; activations — Korthikanti et al.'s
closed form per block for the policy, kept by a forward and released by the backward, all by
the weight-gradient pass W when the backward is split (the simulator's `i_frees=0`, the
zero-bubble paper's count); the vocabulary schedules' shard (`shard_bytes`) kept from S to T.
Recomputation's transient (one block's activations rebuilt during its backward) is left out,
as Korthikanti's per-layer count leaves it out.

Tensor parallelism stays inside a node: tp divides `gpus_per_node` (its groups tile the nodes,
their all-reduces on the device's tensor link), and the heads, the hidden size and the MLP
width. Ranks are laid out as Megatron orders them — tp fastest, then dp, then the pipeline
(`crossings`) — so once the devices fill more than a node the pipeline's messages cross
nodes, and a data-parallel ring does unless its tp × dp ranks tile a node; what crosses pays
the device's inter-node link (`Device.inter_node_*`), everything else its NVLink. Every tp runs every recomputation policy (Megatron does); with tp > 1 activations are
split by sequence parallelism too.
"""
from __future__ import annotations

from ..model.memory_rules import (FREES, FREES_BUT_STASH, FREES_SHARD, FREES_STASH, KEEPS,
                                  KEEPS_SHARD)
from ..sim.costs import Costs
from ..sim.device import Device
from ..sim.flops import RECOMPUTE_POLICIES
from ..sim.partition import balanced_bounds
from ..sim.shape import VOCAB_PASSES, ModelShape, bytes_per_parameter, shape_profile
from .candidate import GB, Candidate
from .mesh import meshes

SHAPE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half",
                   "v-min", "vocab-1", "vocab-2", "v-half-vocab")
GPUS_PER_NODE = 8          # an HGX/DGX node: where NVLink reaches


def crossings(p: int, dp: int, tp: int, gpus_per_node: int) -> tuple[bool, bool]:
    """(the pipeline's messages, the data-parallel ring) cross nodes? Ranks in Megatron's
    order: tp fastest, then dp, then the pipeline, so pipeline neighbours are tp × dp ranks
    apart, and a replica group spans tp × dp consecutive ranks."""
    if p * dp * tp <= gpus_per_node:
        return False, False                         # one node holds them all
    return p > 1, dp > 1 and gpus_per_node % (tp * dp) != 0


class ShapedModel:
    """A GPT of `shape` on `device`s, `gpus_per_node` to a node, its optimizer state kept
    whole ("adamw") or sharded over the replicas ("zero-1")."""
    schedules = SHAPE_SCHEDULES
    policy_names = RECOMPUTE_POLICIES
    recompute_actions = False         # shape.py charges recomputation to I
    unit = ("GB", GB)
    tensor_rule = "divide gpus_per_node (a node), the heads, the hidden size and the MLP's width"

    error = 0.10          # the cost model's own error on a step, as the papers' rows bound it

    def __init__(self, shape: ModelShape, device: Device, gpus_per_node: int = GPUS_PER_NODE,
                 optimizer: str = "adamw"):
        self.shape, self.device, self.gpus_per_node = shape, device, gpus_per_node
        bytes_per_parameter(optimizer)              # refuses an unknown optimizer by name
        self.optimizer = optimizer
        # A block's and the output layer's F + I + W, for balancing stages (per microbatch
        # row; both scale alike with rows and tensor shards).
        probe = shape_profile(shape, 1, 2, device, layers_per_stage=[shape.layers, 0]).table
        self.block = sum(probe[k][0] for k in "FIW") / shape.layers
        self.head = sum(probe[k][1] for k in "FIW")
        self._splits: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self._profiles: dict = {}       # what candidates share (_profiled), one each
        self._blocks: dict = {}         # id(a split) -> (it, blocks per stage)
        self._models: dict = {}
        self._costs: dict = {}

    @property
    def assumes(self) -> str:
        """What the plan's bytes and links assume, in words (the plan's explanation says it)."""
        state = ("ZeRO-1 (the distributed optimizer): 6 + 12/dp bytes a parameter (bf16 "
                 "weights and fp32 gradients whole, fp32 master weights and Adam's moments "
                 "sharded over dp)" if self.optimizer == "zero-1" else
                 "no optimizer sharding: 18 bytes a parameter (bf16 weights 2, fp32 gradients "
                 "4, fp32 master weights 4, Adam's moments 8)")
        d = self.device
        inter = d.link(inter_node=True)[1]
        return (f"{state}; links: {d.link_bandwidth / 1e9:g} GB/s inside a node of "
                f"{self.gpus_per_node}, {inter / 1e9:g} GB/s between nodes")

    def max_stages(self, vocab: bool) -> int:
        """Every stage holds a block; without vocabulary parallelism the first and last may
        hold only the embedding or the output layer."""
        return self.shape.layers if vocab else self.shape.layers + 2

    def meshes(self, devices: int, batch_size: int):
        """(p, dp, tp, 1): see the module's docstring for tp's rule; no experts."""
        shape = self.shape
        ffn = shape.ffn if shape.ffn is not None else 4 * shape.hidden

        def ok(tp: int) -> bool:
            return not (self.gpus_per_node % tp or shape.heads % tp or shape.hidden % tp
                        or ffn % tp)
        for p, dp, tp in meshes(devices, batch_size, shape.layers + 2, ok):
            yield p, dp, tp, 1

    def shards_vocabulary(self, p: int, dp: int, tp: int) -> bool:
        return p > 1

    def policies(self, asked, tp: int):
        return asked

    def bounds(self, stages: int, rows: int, vocab: bool = False) -> list[tuple[int, int]]:
        """The contiguous split of (embedding, blocks…, output layer) balancing F + I + W; the
        embedding is a lookup (weighs nothing), and so is the output layer when sharded."""
        key = (stages, vocab)           # the weights do not depend on the rows: split once
        if key not in self._splits:
            n = self.shape.layers
            weights = [0.0] + [self.block] * n + [0.0 if vocab else self.head]
            self._splits[key] = balanced_bounds(weights, stages)
        return self._splits[key]

    def profile(self, c: Candidate):
        """shape_profile for the candidate: its blocks per stage, microbatch, tp, policy."""
        key = self._profiled(c)
        if key not in self._profiles:
            rows, blocks, tensor, policy, passes, ranks, dp, (pipe, data) = key
            self._profiles[key] = shape_profile(self.shape, rows, len(blocks), self.device,
                                                tensor, policy, passes, list(blocks),
                                                ranks=ranks, optimizer=self.optimizer,
                                                data_parallel=dp, pipeline_inter_node=pipe,
                                                data_inter_node=data)
        return self._profiles[key]

    def _profiled(self, c: Candidate) -> tuple:
        """What the candidate's profile depends on (beyond the shape and the device)."""
        split = self._blocks.get(id(c.bounds))      # candidates share the splits of bounds()
        if split is None or split[0] is not c.bounds:
            n = self.shape.layers
            split = self._blocks[id(c.bounds)] = c.bounds, tuple(
                min(b, n + 1) - max(a, 1) for a, b in c.bounds)
        sharded = c.data_parallel if self.optimizer == "zero-1" else 1   # bytes depend on dp
        return (c.rows, split[1], c.tensor, c.recompute, VOCAB_PASSES.get(c.schedule),
                c.pipeline, sharded,
                crossings(c.pipeline, c.data_parallel, c.tensor, self.gpus_per_node))

    def model(self, c: Candidate, sched) -> tuple[Costs, list[float], dict]:
        """(stage costs, static bytes per rank, byte rule → [(added, released)] per stage)."""
        key = (self._profiled(c), tuple(sched.placement))
        if key not in self._models:              # candidates of other families share it
            prof = self.profile(c)
            static = [0.0] * sched.ranks
            for stage, rank in enumerate(sched.placement):
                static[rank] += prof.static_bytes[stage]
            # vocabulary schedules run rank r's shard passes S and T on stage r
            shard = [prof.shard_bytes if s < c.pipeline else 0.0 for s in range(len(c.bounds))]
            acts = prof.activation_bytes
            # I frees nothing, W all (i_frees = 0); recomputation has no R action here
            table = {KEEPS: [(a, 0.0) for a in acts], FREES: [(0.0, a) for a in acts],
                     FREES_BUT_STASH: [(0.0, 0.0) for _ in acts],
                     FREES_STASH: [(0.0, a) for a in acts],
                     KEEPS_SHARD: [(x, 0.0) for x in shard],
                     FREES_SHARD: [(0.0, x) for x in shard]}
            self._models[key] = static, table
        timed = (key[0], c.data_parallel)       # costs do not depend on the placement
        if timed not in self._costs:
            self._costs[timed] = Costs.per_stage(**self.profile(c).table,
                                                 replicas=c.data_parallel)
        static, table = self._models[key]
        return self._costs[timed], list(static), table
