"""Tensor parallelism: the split layers and block against the unsplit ones (on 2 processes),
the shards put back together, the mesh's tp axis and the run's argument checks."""
from __future__ import annotations

import pytest
import torch

import pipelab as pl
from pipelab.model.gpt import build_layer
from pipelab.techniques.tensor import TensorParallel, TensorParallelBlock, unshard
from pipelab.chapters.tensor_and_pipeline_check import check_block, compare_linears
from pipelab.runtime.spec import prepare_run

pytestmark = pytest.mark.timeout(180)

CFG = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=8)
TOL = 1e-5


def test_column_and_row_parallel_linears_are_exact(clusters):
    shards = clusters(2).call("pipelab.chapters.tensor_and_pipeline_check:linear_pass", CFG.as_dict())
    errors = compare_linears(CFG, shards)
    assert max(errors.values()) < TOL, errors
    # Only process 0 adds the row-parallel bias: the others hold none (it is summed once).
    assert shards[0]["row"]["bias"] is not None and shards[1]["row"]["bias"] is None


@pytest.mark.parametrize("deferred", [False, True], ids=["B", "I then W"])
def test_a_tensor_parallel_block_is_exact(clusters, deferred):
    errors = check_block(clusters(2), CFG, deferred)
    assert max(errors.values()) < TOL, errors
    assert len(errors) == 2 + 12          # output, input grad and every parameter of the block


def test_a_block_all_reduces_twice_forward_and_twice_backward(clusters):
    shards = clusters(2).call("pipelab.chapters.tensor_and_pipeline_check:shard_pass", CFG.as_dict(), True)
    assert shards[0]["all_reduces"] == ["forward", "forward", "backward", "backward"]


def test_shards_put_back_together_are_the_block():
    block = build_layer(CFG, 1)
    parts = [{f"layers.1.{n}": p.detach() for n, p in
              TensorParallelBlock(build_layer(CFG, 1), TensorParallel(2, t)).named_parameters()}
             for t in range(2)]
    # Each process holds half of every split matrix (q, k and v of its own heads)...
    assert parts[0]["layers.1.qkv.weight"].shape == (3 * 16, 32)
    whole = unshard(parts)
    for name, p in block.named_parameters():
        assert torch.equal(whole[f"layers.1.{name}"], p), name


def test_the_mesh_has_a_tensor_parallel_axis():
    mesh = pl.Mesh(pp=2, tp=2)
    assert [mesh.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert mesh.tp_group(1) == (2, 3) and mesh.peer(3, 0) == 1    # shard 1 talks to shard 1
    assert mesh.name(3) == "pp 1 / tp 1"
    big = pl.Mesh(pp=2, dp=2, tp=2)
    assert all(big.rank(*big.coords(r)) == r for r in range(8))
    assert big.dp_group(1, 1) == (3, 7) and big.pipeline(1, 1) == (5, 7)
    assert list(big.groups())[-4:] == ["tp 0 / dp 0", "tp 1 / dp 0", "tp 0 / dp 1", "tp 1 / dp 1"]
    assert list(pl.Mesh(pp=2, dp=2).groups()) == ["dp 0", "dp 1", "pipeline 0", "pipeline 1"]


def test_bad_tensor_parallel_arguments_are_refused_before_any_process_starts():
    s = pl.schedule("1f1b", ranks=2, microbatches=4)
    with pytest.raises(ValueError, match=r"LocalCluster\(ranks=4\)"):
        prepare_run(s, ranks=2, model=CFG, tensor_parallel=2)
    with pytest.raises(ValueError, match="must divide ModelConfig.n_heads"):
        prepare_run(s, ranks=6, model=CFG, tensor_parallel=3)
    with pytest.raises(ValueError, match="tensor_parallel"):
        prepare_run(s, ranks=2, model=CFG, tensor_parallel=0)
    with pytest.raises(ValueError, match="not supported yet together with recompute"):
        prepare_run(s, ranks=4, model=CFG, tensor_parallel=2, recompute="full")


def test_in_turns_stops_the_work_at_each_pause_and_hands_back_its_result_or_error():
    """The braided backward's mechanism (techniques/tensor_braid.py), without processes: the work
    runs only between the generator's resumptions, and its return value / exception come back."""
    from pipelab.techniques import tensor, tensor_braid as braid

    trace = []

    def work():
        trace.append("launch")
        tensor._braid.pause()          # what f's backward does after an async launch
        trace.append("wait")
        return 7

    turns = braid.in_turns(work)
    next(turns)
    assert trace == ["launch"]         # stopped at the pause: the partner's turn
    with pytest.raises(StopIteration) as stop:
        next(turns)
    assert stop.value.value == 7 and trace == ["launch", "wait"]

    def failing():
        raise ValueError("in the backward")

    with pytest.raises(ValueError, match="in the backward"):
        next(braid.in_turns(failing))
    assert getattr(tensor._braid, "pause", None) is None     # not left set on this thread
