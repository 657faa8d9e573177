"""Vocabulary parallelism without processes: the sharded softmax algebra, the schedules'
shape in simulation, the validator on broken barriers, and the parameter bytes per rank."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pipelab as pl
from pipelab.model.data import context_tokens, corpus_tokens
from pipelab.techniques.vocab import parameter_bytes, shard_rows, sharded_cross_entropy


def _unsharded(x, w, t):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    loss = F.cross_entropy(x @ w.t(), t)
    loss.backward()
    return loss.detach(), x.grad, w.grad


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_sharded_cross_entropy_equals_the_full_one(shards, fused, scale):
    """Random inputs, and logits in the hundreds (exp would overflow float32 without the
    all-reduced max first); an uneven vocabulary of 101 rows; targets in every shard."""
    gen = torch.Generator().manual_seed(shards)
    x = torch.randn(24, 16, generator=gen) * scale ** 0.5
    w = torch.randn(101, 16, generator=gen) * scale ** 0.5
    t = torch.randint(0, 101, (24,), generator=gen)
    loss, dx, dw = sharded_cross_entropy(x, w, t, shards, fused=fused)
    ref_loss, ref_dx, ref_dw = _unsharded(x, w, t)
    assert torch.isfinite(loss) and loss.item() > 1.0       # big logits: a real, finite loss
    assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    for got, ref in ((dx, ref_dx), (dw, ref_dw)):
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_extreme_logits_do_not_overflow():
    """One shard's logits near 1e4, another's near −1e4: the max is global before any exp."""
    x = torch.ones(4, 1)
    w = torch.cat([torch.full((3, 1), 1e4), torch.full((3, 1), -1e4)])
    w[1] = 1e4 - 2.0
    t = torch.tensor([0, 1, 4, 5])
    loss, dx, dw = sharded_cross_entropy(x, w, t, 2)
    ref_loss, ref_dx, ref_dw = _unsharded(x, w, t)
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()
    assert torch.allclose(loss, ref_loss, rtol=1e-6) and torch.allclose(dw, ref_dw, atol=1e-6)


def test_shards_cover_the_vocabulary_once():
    rows = [shard_rows(101, 4, r) for r in range(4)]
    assert rows == [(0, 26), (26, 51), (51, 76), (76, 101)]


@pytest.mark.parametrize("name,extra", [("vocab-1", 2), ("vocab-2", 1)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_peaks_and_makespan_on_unit_costs(name, extra, p):
    """Rank r holds p+extra−r microbatches (1F1B: p−r); with free vocabulary passes the
    makespan is 1F1B's, (m+p−1)(F+B)."""
    m = 2 * p + 2
    tl = pl.simulate(pl.schedule(name, ranks=p, microbatches=m), pl.Costs(F=1, I=1, W=1))
    assert tl.peak_activations() == {r: float(p + extra - r) for r in range(p)}
    assert tl.makespan == pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m)).makespan \
        == (m + p - 1) * 3


def test_vocabulary_passes_are_costed():
    """S and T on every rank, barriers beside the compute: with S = T = 0.5 the balanced
    vocabulary work lengthens the step by about m·(S+T), not by the head on one stage."""
    s = pl.schedule("vocab-2", ranks=4, microbatches=8)
    free = pl.simulate(s, pl.Costs(F=1, I=1, W=1)).makespan
    costed = pl.simulate(s, pl.Costs(F=1, I=1, W=1, kinds={"S": 0.5, "T": 0.5}))
    assert free < costed.makespan <= free + 8 * 1.0 + 3
    busy = costed.busy()
    assert max(busy.values()) - min(busy.values()) < 1e-9        # every rank the same work


def test_a_barrier_on_one_rank_only_is_rejected():
    s = pl.schedule("vocab-2", ranks=2, microbatches=4)
    broken = pl.Schedule([list(s.actions[0]), [a for a in s.actions[1] if str(a) != "1C2"]],
                         s.placement, s.microbatches)
    with pytest.raises(pl.ScheduleError, match="rank 1 never reaches 1C2"):
        broken.validate()


def test_barriers_in_a_different_order_deadlock():
    s = pl.schedule("vocab-1", ranks=2, microbatches=4)
    rank1 = list(s.actions[1])
    i, j = rank1.index(pl.Action.parse("1Ct1")), rank1.index(pl.Action.parse("1Cs2"))
    rank1[i], rank1[j] = rank1[j], rank1[i]
    with pytest.raises(pl.ScheduleError, match="deadlock"):
        pl.Schedule([s.actions[0], rank1], s.placement, s.microbatches).validate()


def test_vocabulary_parameter_bytes_balance():
    cfg = pl.ModelConfig(d_model=64, vocab_size=32_768)
    table = 32_768 * 64 * 4
    assert parameter_bytes(cfg, 4, sharded=False) == [table, 0, 0, table]
    assert parameter_bytes(cfg, 4, sharded=True) == [table // 2] * 4
    tied = pl.ModelConfig(d_model=64, vocab_size=32_768, tie_embeddings=True)
    assert parameter_bytes(tied, 4, sharded=True) == [table // 4] * 4
    # An uneven vocabulary: the shards hold every row once, none twice, sizes one row apart.
    odd = pl.ModelConfig(d_model=8, vocab_size=1001)
    for p in (2, 3, 4, 7):
        sharded = parameter_bytes(odd, p, sharded=True)
        assert sum(sharded) == sum(parameter_bytes(odd, p, sharded=False)) == 2 * 1001 * 8 * 4
        assert max(sharded) - min(sharded) <= 2 * 8 * 4


def test_context_tokens_spread_over_the_vocabulary():
    x, y = pl.get_batch(8, 32, seed=0)
    big, big_y = pl.get_batch(8, 32, seed=0, vocab_size=32_768)
    assert torch.equal(big % pl.VOCAB_SIZE, x) and torch.equal(big_y % pl.VOCAB_SIZE, y)
    assert big.max() < 32_768 and len(big.unique()) > 4 * len(x.unique())
    small, _ = pl.get_batch(8, 32, seed=0, vocab_size=64)      # one variant: the characters
    assert torch.equal(small, x)
    # The whole text uses a large share of a 32k vocabulary (data/README.md's table: 13,324),
    # in every eighth of it; two characters of context would cap it near 1.2k ids.
    used = context_tokens(corpus_tokens("train"), 32_768).unique()
    assert 12_000 < len(used) < 32_768
    assert len((used * 8 // 32_768).unique()) == 8


@pytest.mark.parametrize("name,barriers", [("vocab-1", ("Ct", "Cs")), ("vocab-2", ("C",))])
def test_each_output_step_is_t_then_s_then_its_barriers(name, barriers):
    """The paper's lm-head step on every rank: T(i−1) right before S(i), then Vocab-1's two
    barriers (C1 of i−1 issued with C0 of i) or Vocab-2's one; one embedding pass of each
    kind per microbatch, on every rank."""
    p, m = 4, 10
    s = pl.schedule(name, ranks=p, microbatches=m)
    for r, acts in enumerate(s.actions):
        seq = [(a.kind, a.microbatch) for a in acts]
        for i in range(m):
            at = seq.index(("S", i))
            step = [("T", i - 1)] * (i > 0) + [("S", i)]
            after = [(k, i - 1 if k == "Ct" else i) for k in barriers if i > 0 or k != "Ct"]
            assert seq[at - len(step) + 1:at + 1 + len(after)] == step + after, (r, i)
        kinds = [k for k, _ in seq]
        assert {k: kinds.count(k) for k in ("S", "T", "Vf", "Vb", "Cs", "Ct", "C")} == {
            "S": m, "T": m, "Vf": m, "Vb": m, "Cs": m * (name == "vocab-1"),
            "Ct": m * (name == "vocab-1"), "C": m * (name == "vocab-2")}
