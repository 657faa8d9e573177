"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): one block split over `t` processes.

A Linear y = x·Wᵀ + b can be split two ways. Column-parallel: each process keeps some rows of
W (some output features) and computes its slice of y from the whole x. Row-parallel: each keeps
some columns of W (some input features), multiplies its slice of x, and the partial products
are summed over the processes — an all-reduce. Megatron chains the two so that one all-reduce
per sub-layer is enough:

    attention   x ─ f ─ qkv (column: this process's heads) ─ attention ─ proj (row) ─ g ─ y
    MLP         x ─ f ─ up  (column: a slice of the hidden) ─ gelu ─ down (row) ─ g ─ y

g all-reduces in the forward (the sum of partial products) and is the identity backward;
f is its mirror: the identity forward, an all-reduce of the input gradient backward (each
process's heads contribute a part of dx). So a block costs two all-reduces in F and two in the
input-gradient backward (I, or B), none in W: the weight gradients of a shard are its own.
LayerNorms, the embedding and the head are replicated (every process computes them whole).

The shards are `weight_grad.Linear`s, so the deferred weight gradient (I now, W later) works as
on the unsplit model. Every all-reduce is timed into `TensorParallel.log`; the runtime turns
the log into `Tp` events on the rank's communication lane, so the TP bubble shows. Under an
emulated link (runtime/link.py) each all-reduce completes no earlier than the ring time,
2(t−1)·α + 2(t−1)/t · bytes/β, after the last shard posted it.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..model.gpt import AttentionCore, Block
from ..runtime.techniques import Technique, register_technique
from ..schedules.actions import Action
from ..schedules.updates import UPDATE
from ..sim.tensor_overlap import TP_REDUCE     # the timelines' kind of its all-reduces
from ..model.weight_grad import Linear
from ..runtime.link import collective


class TensorParallel:
    """This process's place in its tensor-parallel group, and a log of its all-reduces."""

    def __init__(self, size: int = 1, rank: int = 0, group=None, link=None):
        self.size, self.rank, self.group, self.link = size, rank, group, link
        self.log: list[tuple[float, float, str]] = []    # (start, end, "forward"/"backward")
        self.handles: list = []      # all-reduces launched asynchronously, not yet waited for

    def shard(self, layers: nn.Sequential) -> nn.Sequential:
        """This process's shard of `layers` (shard_layers)."""
        return shard_layers(layers, self)

    def all_reduce(self, tensor: torch.Tensor, what: str, async_op: bool = False):
        """Sum `tensor` in place over the group (timed); with async_op, return a handle whose
        `wait()` finishes it (and logs it)."""
        if self.size == 1:
            return _Done() if async_op else None
        import torch.distributed as dist
        start = time.perf_counter()
        link = self.link
        seconds = link.allreduce_time(tensor.numel() * tensor.element_size(), self.size) \
            if link is not None else 0.0
        handle = collective(lambda: dist.all_reduce(tensor, group=self.group, async_op=True),
                            self.group, seconds, link)
        if not async_op:
            handle.wait()
            self.log.append((start, time.perf_counter(), what))
            return None
        return _Pending(self, handle, start, what)


class _Done:
    def wait(self) -> None:
        return None


class _Pending:
    """An async all-reduce; its logged span runs from launch to the moment it is waited for
    (or seen complete), which is when the compute that needed it could go on."""

    def __init__(self, tp: TensorParallel, handle, start: float, what: str):
        self.tp, self.handle, self.start, self.what = tp, handle, start, what

    def wait(self) -> None:
        if self.handle is not None:
            self.handle.wait()
            self.tp.log.append((self.start, time.perf_counter(), self.what))
            self.handle = None


# Set on the thread of a braided backward (techniques/tensor_braid.py): a function that hands the turn
# to the step's other part until it is this backward's turn again. Thread-local, because that
# backward runs on a thread of its own while the executor's thread runs the other part.
_braid = threading.local()


@contextmanager
def pausing(pause):
    """Inside (on this thread): f's backward launches its all-reduce asynchronously and calls
    `pause()` before waiting for it, so other work can run while the sum travels."""
    _braid.pause = pause
    try:
        yield
    finally:
        _braid.pause = None


class _CopyToShards(torch.autograd.Function):
    """Megatron's f: identity forward; backward, sum the input gradient over the group."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.clone()
        pause = getattr(_braid, "pause", None)
        if pause is None:
            ctx.tp.all_reduce(dy, "backward")
        else:
            pending = ctx.tp.all_reduce(dy, "backward, async", async_op=True)
            pause()                  # the braid's other part computes while the sum travels
            pending.wait()
        return dy, None


class _SumOfShards(torch.autograd.Function):
    """Megatron's g: sum the partial outputs over the group forward; identity backward."""

    @staticmethod
    def forward(ctx, y, tp):
        y = y.clone()
        tp.all_reduce(y, "forward")
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def _rows_of(linear: nn.Linear, rows: torch.Tensor, in_cols: torch.Tensor | None,
             bias: bool, cls) -> Linear:
    """A `cls` Linear holding `rows` (output features) and `in_cols` (input features) of `linear`."""
    weight = linear.weight[rows] if in_cols is None else linear.weight[:, in_cols]
    shard = cls(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        shard.weight.copy_(weight)
        if bias:
            shard.bias.copy_(linear.bias[rows] if in_cols is None else linear.bias)
    return shard


class ColumnParallelLinear(Linear):
    """Some output features of a Linear; its input passes through f (gradient summed)."""
    tp: TensorParallel

    @classmethod
    def of(cls, linear: nn.Linear, rows: torch.Tensor, tp: TensorParallel) -> "ColumnParallelLinear":
        shard = _rows_of(linear, rows, None, linear.bias is not None, cls)
        shard.tp = tp
        return shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            x = _CopyToShards.apply(x, self.tp)
        return super().forward(x)


class RowParallelLinear(Linear):
    """Some input features of a Linear; the partial outputs are summed by g. The bias is
    added once, by the group's process 0, before the sum."""
    tp: TensorParallel

    @classmethod
    def of(cls, linear: nn.Linear, cols: torch.Tensor, tp: TensorParallel) -> "RowParallelLinear":
        shard = _rows_of(linear, None, cols, linear.bias is not None and tp.rank == 0, cls)
        shard.tp = tp
        return shard

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This process's share of the output, before the sum (for an async all-reduce)."""
        return super().forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SumOfShards.apply(self.partial(x), self.tp)


def head_features(d_model: int, n_heads: int, size: int, rank: int) -> torch.Tensor:
    """The features (columns of the attention output) of process `rank`'s heads."""
    per = n_heads // size
    width = d_model // n_heads
    return torch.arange(rank * per * width, (rank + 1) * per * width)


def hidden_features(ffn: int, size: int, rank: int) -> torch.Tensor:
    per = ffn // size
    return torch.arange(rank * per, (rank + 1) * per)


class TensorParallelBlock(nn.Module):
    """A `model.Block` split over a tensor-parallel group: this process's heads and its slice
    of the MLP's hidden layer. Same parameter names as the Block (shards of them)."""

    def __init__(self, block: Block, tp: TensorParallel):
        super().__init__()
        d, heads, ffn = block.qkv.in_features, block.n_heads, block.up.out_features
        check_divisible(heads, ffn, tp.size)
        cols = head_features(d, heads, tp.size, tp.rank)
        hidden = hidden_features(ffn, tp.size, tp.rank)
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.core = AttentionCore(heads // tp.size)       # this process's heads only
        # q, k and v of this process's heads: the same columns in each third of qkv's rows.
        self.qkv = ColumnParallelLinear.of(block.qkv, torch.cat([cols, cols + d, cols + 2 * d]), tp)
        self.proj = RowParallelLinear.of(block.proj, cols, tp)
        self.up = ColumnParallelLinear.of(block.up, hidden, tp)
        self.down = RowParallelLinear.of(block.down, hidden, tp)

    def attention_partial(self, x: torch.Tensor) -> torch.Tensor:
        """The attention sub-layer up to (not including) its all-reduce: ln1 → f → qkv → heads → proj."""
        return self.proj.partial(self.core(self.qkv(self.ln1(x))))

    def mlp_partial(self, x: torch.Tensor) -> torch.Tensor:
        return self.down.partial(F.gelu(self.up(self.ln2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + _SumOfShards.apply(self.attention_partial(x), self.proj.tp)
        return x + _SumOfShards.apply(self.mlp_partial(x), self.down.tp)


def check_divisible(n_heads: int, ffn: int, size: int) -> None:
    """ValueError unless the heads and the MLP's hidden width split evenly over `size`."""
    if n_heads % size:
        raise ValueError(f"tensor_parallel={size} must divide ModelConfig.n_heads ({n_heads}): "
                         f"attention is split by whole heads")
    if ffn % size:
        raise ValueError(f"tensor_parallel={size} must divide the MLP's hidden width ({ffn})")


def shard_layers(layers: nn.Sequential, tp: TensorParallel) -> nn.Sequential:
    """The same layers with every Block split over `tp` (others stay whole, replicated)."""
    if tp.size == 1:
        return layers
    return nn.Sequential(*(TensorParallelBlock(layer, tp) if isinstance(layer, Block) else layer
                           for layer in layers))


# How each shard's gradient goes back into the unsplit parameter: the dimension the shards are
# side by side on (qkv: per third), or None for a tensor only process 0 holds (a row-parallel
# bias) or every process holds whole (LayerNorms, embedding, head).
_SPLIT = {"qkv.weight": "thirds", "qkv.bias": "thirds", "proj.weight": 1, "up.weight": 0,
          "up.bias": 0, "down.weight": 1}


def unshard(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Gradients (or weights) of one pipeline rank's tensor-parallel processes, by name, put
    back together as the unsplit model's: `shards[t]` is process t's dict."""
    whole = {}
    for name, first in shards[0].items():
        rule = _SPLIT.get(name.split(".", 2)[-1]) if name.count(".") >= 2 else None
        if rule is None:
            whole[name] = first
            continue
        pieces = [s[name] for s in shards]
        if rule == "thirds":
            thirds = [p.chunk(3, dim=0) for p in pieces]
            whole[name] = torch.cat([t[i] for i in range(3) for t in thirds], dim=0)
        else:
            whole[name] = torch.cat(pieces, dim=rule)
    return whole


# --- in the runtime (runtime/techniques.py) ----------------------------------------------------
def prepare_run(draft) -> bool:
    """`cluster.run(..., tensor_parallel=tp)`: tp shards of every pipeline rank, whose heads and
    MLP width split evenly; not yet together with recomputation, a sharded vocabulary, updates
    inside the schedule or experts (checked once every technique has prepared)."""
    tp, dp, schedule = draft.tensor_parallel, draft.data_parallel, draft.schedule
    if tp == 1:
        return False
    if schedule.ranks * dp * tp != draft.ranks:
        raise ValueError(
            f"the mesh is {schedule.ranks} pipeline ranks × {dp} data-parallel replicas × {tp} "
            f"tensor-parallel shards = {schedule.ranks * dp * tp} processes, but the cluster has "
            f"{draft.ranks}: use LocalCluster(ranks={schedule.ranks * dp * tp})")
    check_divisible(draft.cfg.n_heads, draft.cfg.ffn_width, tp)
    draft.later(_alone)
    draft.braided = True       # a compound step computes one part while another's all-reduce runs
    return True


def _alone(draft) -> None:
    if draft.recompute or draft.split_untied or UPDATE in draft.schedule.kinds() or draft.cfg.moe:
        raise ValueError("tensor_parallel > 1 is not supported yet together with recompute=..., "
                         "a sharded vocabulary, optimizer updates (U) inside the schedule or a "
                         "mixture-of-experts model (n_experts): run one or the other")


def setup_rank(run) -> None:
    """Split this rank's blocks over its tensor-parallel group; the all-reduces are timed into
    the stages' log of spans inside actions, which the executor gives to the running part."""
    mesh = run.spec.mesh
    tp = TensorParallel(mesh.tp, run.shard, run.group(mesh.tp_group(run.pp, run.replica)),
                        run.spec.link)
    tp.log = run.stages.log
    run.stages.shard(tp)


@contextmanager
def time_step(run, state):
    """After the step: each all-reduce becomes an event on the communication lane."""
    yield
    step = run.report["steps"][-1]
    step.setdefault("events", []).extend(
        (Action(part.stage, TP_REDUCE, part.microbatch), start, end, end - start)
        for part, start, end, _what in step["inside"])


def assemble_run(assembly) -> None:
    """Shards' gradients put back together for the reference check; each pipeline rank's
    all-reduces of the last step, seconds from the step's start."""
    assembly.merge = unshard
    t0, last = assembly.t0, assembly.last
    assembly.result.tp_all_reduces = {
        rep["rank"]: [(part, s - t0, e - t0, what) for part, s, e, what in rep["steps"][last]["inside"]]
        for rep in assembly.reports}


register_technique(Technique("tensor", prepare=prepare_run, setup=setup_rank, step=time_step,
                             assemble=assemble_run, priced=(TP_REDUCE,)))
