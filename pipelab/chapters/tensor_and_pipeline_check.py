"""Tensor parallelism checked against the unsplit block, on the processes of a LocalCluster.

    with pl.LocalCluster(ranks=2) as cluster:
        report = check_block(cluster, cfg)     # {"output": 3e-8, "input grad": ..., ...}

Every process builds the same block (layer 1 of the model), keeps its shard, runs a forward and
a backward on the same input, and sends back its output, input gradient and shard gradients;
the parent puts the shards together (`unshard`) and compares with the whole block run here.
`deferred=True` runs the backward as I (weight GEMMs set aside) then W, as zero-bubble does.
"""
from __future__ import annotations

import torch

from ..model.gpt import ModelConfig, build_layer
from ..model.weight_grad import WeightGradStore
from ..techniques.tensor import (ColumnParallelLinear, RowParallelLinear, TensorParallel,
                                 TensorParallelBlock, hidden_features, unshard)


def _input(cfg: ModelConfig, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cfg.seq_len, cfg.d_model, generator=gen)
    dy = torch.randn(rows, cfg.seq_len, cfg.d_model, generator=gen)
    return x, dy


def _run(block, x: torch.Tensor, dy: torch.Tensor, deferred: bool):
    x = x.clone().requires_grad_()
    y = block(x)
    if deferred:
        store = WeightGradStore()
        with store.deferring(1, 0):
            torch.autograd.backward(y, dy)
        store.flush(1, 0)
    else:
        torch.autograd.backward(y, dy)
    grads = {f"layers.1.{n}": p.grad.clone() for n, p in block.named_parameters()}
    return y.detach(), x.grad, grads


def shard_pass(cfg_dict: dict, deferred: bool = False, size: int | None = None) -> dict | None:
    """On one process of the cluster: this shard's output, input gradient, parameter gradients
    and the all-reduces it timed. The group is processes 0 … size−1 (default: all of them);
    the others return None."""
    import torch.distributed as dist
    cfg = ModelConfig(**cfg_dict)
    size = size or dist.get_world_size()
    group = dist.new_group(list(range(size))) if size < dist.get_world_size() else None
    if dist.get_rank() >= size:
        return None
    tp = TensorParallel(size, dist.get_rank(), group)
    block = TensorParallelBlock(build_layer(cfg, 1), tp)
    x, dy = _input(cfg)
    y, dx, grads = _run(block, x, dy, deferred)
    return {"output": y, "input grad": dx, "grads": grads,
            "all_reduces": [what for _s, _e, what in tp.log]}


def compare(cfg: ModelConfig, shards: list[dict], deferred: bool = False) -> dict[str, float]:
    """Max relative error of the shards' output, input gradient and (put together) parameter
    gradients against the whole block; the processes' outputs must also agree exactly."""
    x, dy = _input(cfg)
    y, dx, grads = _run(build_layer(cfg, 1), x, dy, deferred)
    whole = unshard([s["grads"] for s in shards])

    def rel(got, ref):
        return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    errors = {"output": max(rel(s["output"], y) for s in shards),
              "input grad": max(rel(s["input grad"], dx) for s in shards)}
    errors.update({name: rel(whole[name], ref) for name, ref in grads.items()})
    return errors


def check_block(cluster, cfg: ModelConfig, deferred: bool = False,
                size: int | None = None) -> dict[str, float]:
    """Split a block over the first `size` processes of `cluster` (default all) and compare."""
    shards = cluster.call("pipelab.chapters.tensor_and_pipeline_check:shard_pass", cfg.as_dict(), deferred,
                          size)
    return compare(cfg, [s for s in shards if s is not None], deferred)


def linear_pass(cfg_dict: dict) -> dict:
    """On one process: a column-parallel and a row-parallel Linear alone (the block's `up` and
    `down`), each run forward and backward on the same input as the whole layer."""
    import torch.distributed as dist
    cfg = ModelConfig(**cfg_dict)
    tp = TensorParallel(dist.get_world_size(), dist.get_rank(), None)
    block = build_layer(cfg, 1)
    cols = hidden_features(cfg.ffn_width, tp.size, tp.rank)
    out = {}
    for name, layer, whole_in in (("column", ColumnParallelLinear.of(block.up, cols, tp), True),
                                  ("row", RowParallelLinear.of(block.down, cols, tp), False)):
        x, dy = _linear_input(cfg, name)
        x = (x if whole_in else x[..., cols]).clone().requires_grad_()
        y = layer(x)
        y.backward(dy[..., cols] if name == "column" else dy)
        out[name] = {"output": y.detach(), "input grad": x.grad,
                     "weight": layer.weight.grad, "bias": getattr(layer.bias, "grad", None)}
    return out


def _linear_input(cfg: ModelConfig, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    width_in, width_out = (cfg.d_model, cfg.ffn_width) if name == "column" else \
        (cfg.ffn_width, cfg.d_model)
    return (torch.randn(2, cfg.seq_len, width_in, generator=gen),
            torch.randn(2, cfg.seq_len, width_out, generator=gen))


def compare_linears(cfg: ModelConfig, shards: list[dict]) -> dict[str, float]:
    """Max relative errors of the column- and row-parallel shards against the whole Linears:
    column outputs side by side, row outputs summed (every process holds the sum)."""
    block = build_layer(cfg, 1)

    def rel(got, ref):
        return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    errors = {}
    for name, whole in (("column", block.up), ("row", block.down)):
        x, dy = _linear_input(cfg, name)
        x = x.clone().requires_grad_()
        y = whole(x)
        y.backward(dy)
        got = [s[name] for s in shards]
        if name == "column":
            errors["column output"] = rel(torch.cat([g["output"] for g in got], -1), y)
            errors["column input grad"] = max(rel(g["input grad"], x.grad) for g in got)
            errors["column weight grad"] = rel(torch.cat([g["weight"] for g in got]), whole.weight.grad)
            errors["column bias grad"] = rel(torch.cat([g["bias"] for g in got]), whole.bias.grad)
        else:
            errors["row output"] = max(rel(g["output"], y) for g in got)
            errors["row input grad"] = rel(torch.cat([g["input grad"] for g in got], -1), x.grad)
            errors["row weight grad"] = rel(torch.cat([g["weight"] for g in got], 1), whole.weight.grad)
            errors["row bias grad"] = rel(got[0]["bias"], whole.bias.grad)
    return errors
