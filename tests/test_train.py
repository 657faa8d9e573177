"""Single-process training: the loss falls, runs are reproducible, arguments are checked."""
from __future__ import annotations

import math

import pytest
import torch

import pipelab as pl
from pipelab.support.threads import one_thread

TINY = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16)


def test_default_config_learns_within_100_steps():
    # Its purpose: the default model learns, from log(vocab) to well below it. 100 steps show it
    # (measured: 4.16 -> 1.90 averaged over steps 81-100; 1.27 at 200) at 2.5 s of CPU time; on
    # one torch thread, since two threads on a loaded machine wait for each other at every
    # product (200 steps ran past pytest's 600 s at load 20 on two cores). How long it takes is
    # a benchmark's business, not a unit test's.
    cfg = pl.ModelConfig()
    with one_thread():
        losses = pl.train(cfg, steps=100, progress=False)
    assert len(losses) == 100 and all(isinstance(v, float) for v in losses)
    assert abs(losses[0] - math.log(cfg.vocab_size)) < 0.15
    final = sum(losses[-20:]) / 20
    assert final < 2.2, f"loss {losses[0]:.2f} -> {final:.2f} after 100 steps"


def test_loss_falls_on_a_short_run():
    losses = pl.train(TINY, steps=40, batch_size=8, progress=False)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.8


def test_training_is_reproducible():
    a = pl.train(TINY, steps=5, progress=False)
    b = pl.train(TINY, steps=5, progress=False)
    c = pl.train(TINY, steps=5, seed=1, progress=False)
    assert a == b
    assert a != c


def test_train_updates_a_given_model_in_place():
    model = pl.ToyGPT(TINY)
    before = model.layers[1].qkv.weight.clone()
    pl.train(TINY, steps=3, progress=False, model=model)
    assert not torch.equal(before, model.layers[1].qkv.weight)
    with pytest.raises(ValueError, match="different ModelConfig"):
        pl.train(pl.ModelConfig(), steps=1, progress=False, model=model)


@pytest.mark.parametrize("kwargs,name", [
    (dict(steps=0), "steps"), (dict(steps=1.5), "steps"), (dict(batch_size=-1), "batch_size"),
    (dict(lr=0), "lr"), (dict(lr=-1e-3), "lr"), (dict(lr=float("nan")), "lr"),
    (dict(seed=1.5), "seed"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pl.train(TINY, progress=False, **kwargs)


def test_vocabulary_must_cover_the_alphabet():
    with pytest.raises(ValueError, match="vocab_size"):
        pl.train(pl.ModelConfig(vocab_size=pl.VOCAB_SIZE - 1), steps=1, progress=False)


def test_sample_and_evaluate():
    model = pl.ToyGPT(TINY)
    assert abs(pl.evaluate(model, batches=2) - math.log(TINY.vocab_size)) < 0.2
    text = pl.sample(model, "the cat", n=20)
    assert text.startswith("the cat") and len(text) == 27
    assert set(text) <= set(pl.ALPHABET)
    assert pl.sample(model, "the cat", n=20) == text
    assert pl.sample(model, "ab", n=0) == "ab"
    assert len(pl.sample(model, "x" * 40, n=5, temperature=1.0)) == 45   # longer than seq_len
    with pytest.raises(ValueError, match="'Z'"):
        pl.sample(model, "Zebra", n=3)
    with pytest.raises(ValueError, match="prompt"):
        pl.sample(model, "", n=3)
