"""Vocabulary parallelism live: vocab-1 and vocab-2 on 2 and 4 processes reproduce the unsplit
model's loss and every gradient (the sharded embedding and output projection included)."""
from __future__ import annotations

import pytest

import pipelab as pl


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("name", ["vocab-1", "vocab-2"])
@pytest.mark.parametrize("tied", [False, True])
def test_gradient_exact(clusters, name, ranks, tied):
    # 1001 rows: shards of unequal size; context tokens: targets land in every shard.
    cfg = pl.ModelConfig(n_layers=ranks, d_model=32, n_heads=2, vocab_size=1001, seq_len=16,
                         tokens="contexts", tie_embeddings=tied)
    res = clusters(ranks).run(pl.schedule(name, ranks=ranks, microbatches=ranks + 2), model=cfg)
    assert abs(res.loss - res.reference_loss) <= 1e-5 * res.reference_loss
    assert res.max_grad_error <= 1e-5
    names = set(res.grad_errors)
    assert "layers.0.tok.weight" in names
    assert (f"layers.{cfg.total_layers - 1}.out.weight" in names) == (not tied)


def test_training_steps_follow_single_process_training(clusters):
    """The shards are parameters the optimizer updates: three steps track pl.train's losses."""
    cfg = pl.ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=256, seq_len=16,
                         tokens="contexts")
    res = clusters(2).run(pl.schedule("vocab-2", ranks=2, microbatches=4), model=cfg, steps=3)
    ref = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=4), model=cfg, steps=3)
    assert len(res.loss_history) == 3 and res.loss_history[2] < res.loss_history[0]
    for a, b in zip(res.loss_history, ref.loss_history):
        assert abs(a - b) <= 1e-4 * b
