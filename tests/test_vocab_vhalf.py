"""Vocabulary parallelism on V-Half (`v-half-vocab`): balanced peaks in simulation, the wider
block hiding the barrier, valid at every small microbatch count, clear refusals, and exact live
on 2 ranks with the measured peaks balanced."""
from __future__ import annotations

import pytest

import pipelab as pl
from pipelab.model.memory import activation_bytes
from pipelab.schedules import vocab_vhalf

UNIT = pl.Costs(F=1, I=1, W=1)


@pytest.mark.parametrize("barriers", [1, 2])
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_every_rank_holds_the_same_peak(p, barriers):
    """V-Half's ⌊(p+2)/2⌋ on every rank, plus one microbatch per barrier; vocab-2 on 1F1B at
    the same p spreads p+1−r, one more per rank towards the front."""
    for m in (2 * p + 2, 3 * p + 1):
        tl = pl.simulate(pl.schedule("v-half-vocab", ranks=p, microbatches=m, barriers=barriers),
                         UNIT)
        assert tl.peak_activations() == {r: (p + 2) // 2 + barriers for r in range(p)}, m
    one_f_one_b = pl.simulate(pl.schedule("vocab-2", ranks=p, microbatches=2 * p), UNIT)
    assert max(one_f_one_b.peak_activations().values()) - \
        min(one_f_one_b.peak_activations().values()) == p - 1


@pytest.mark.parametrize("barriers", [1, 2])
def test_the_wider_block_hides_the_barriers(barriers):
    """At odd p the V-Half block has no slot between the bottom forward and its backward: with
    a barrier as long as a chunk's forward, the unwidened order waits for it every microbatch,
    the authors' one interval per barrier hides it (at a microbatch of memory per interval)."""
    costs = pl.Costs(F=1, I=1, W=1, kinds={"S": 0.25, "T": 0.25, "C": 1.0, "Cs": 1.0, "Ct": 1.0})
    p, m = 3, 9
    narrow = pl.simulate(vocab_vhalf.build(p, m, barriers, widen=0), costs)
    wide = pl.simulate(pl.schedule("v-half-vocab", ranks=p, microbatches=m, barriers=barriers),
                       costs)
    assert wide.makespan < narrow.makespan - 1.0
    assert wide.peak_activations()[0] == narrow.peak_activations()[0] + barriers


@pytest.mark.parametrize("barriers", [1, 2])
def test_valid_at_every_small_microbatch_count(barriers):
    """Few microbatches leave the last stage's backward right after its forward in the base
    order: no output-layer step may be due after the backward it gates (else a deadlock)."""
    for p in (2, 3, 4):
        for m in range(1, 2 * p + 2):
            s = pl.schedule("v-half-vocab", ranks=p, microbatches=m, barriers=barriers)
            kinds = [a.kind for a in s.actions[p - 1]]
            assert kinds.count("S") == kinds.count("T") == kinds.count("Vf") == m


def test_each_rank_runs_its_shard_on_its_first_stage():
    """S and T of rank r on stage r (the V's chunk 0); T(i−1) S(i) C(i) back to back; the
    barrier on the last stage, which V-Half puts on rank 0."""
    p, m = 4, 8
    s = pl.schedule("v-half-vocab", ranks=p, microbatches=m)
    assert s.rank_of(2 * p - 1) == 0
    for r, acts in enumerate(s.actions):
        seq = [(a.stage, a.kind, a.microbatch) for a in acts]
        for i in range(1, m):
            at = seq.index((r, "S", i))
            assert seq[at - 1:at + 2] == [(r, "T", i - 1), (r, "S", i), (2 * p - 1, "C", i)]


@pytest.mark.parametrize("option,value,match", [
    ("barriers", 3, "barriers must be 1"), ("barriers", True, "barriers must be 1"),
    ("ranks", 1, "needs ranks >= 2")])
def test_bad_options_are_refused(option, value, match):
    kwargs = {"ranks": 2, "microbatches": 4, option: value}
    with pytest.raises(ValueError, match=match):
        pl.schedule("v-half-vocab", **kwargs)


@pytest.mark.parametrize("tied,barriers", [(False, 1), (True, 2)])
def test_live_exact_with_balanced_measured_peaks(clusters, tied, barriers):
    """2 ranks, one block per stage: loss and every gradient (the shards gathered) match the
    unsplit model, and the meter's peaks differ by less than half a microbatch of a rank's
    layers (1F1B's vocab-2 differs by about one here)."""
    cfg = pl.ModelConfig(n_layers=4, d_model=32, n_heads=2, vocab_size=1001, seq_len=16,
                         tokens="contexts", tie_embeddings=tied)
    s = pl.schedule("v-half-vocab", ranks=2, microbatches=4, barriers=barriers)
    res = clusters(2).run(s, model=cfg, partition="E+t|t|t|t+L", batch_size=8)
    assert abs(res.loss - res.reference_loss) <= 1e-5 * res.reference_loss
    assert res.max_grad_error <= 1e-5
    assert "layers.0.tok.weight" in res.grad_errors
    assert ("layers.5.out.weight" in res.grad_errors) == (not tied)
    bounds = res.spec.bounds
    microbatch = min(sum(activation_bytes(cfg, *bounds[st], rows=2, sharded=True)
                         for st in s.stages_of(r)) for r in range(2))
    peaks = res.peak_activations
    assert abs(peaks[0] - peaks[1]) < 0.5 * microbatch, (peaks, microbatch)
