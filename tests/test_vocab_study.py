"""Chapter 08's cost model (chapters/vocabulary_parallelism.py): the measured profile keeps its
samples, and the simulated methods follow the closed forms the chapter states."""
from __future__ import annotations

import statistics

import pytest

import pipelab as pl
from pipelab.chapters import vocabulary_parallelism as vs

CFG = pl.ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=32, vocab_size=32768)
PROFILE = vs.VocabProfile(CFG, 4, embed=0.0024, block=0.00177, head=0.040, S=0.03, T=0.012,
                          block_bytes=592896)


def test_profile_keeps_every_repeat_behind_its_medians():
    cfg = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, vocab_size=256)
    prof = vs.VocabProfile.measure(cfg, rows=2, repeats=3)
    assert sorted(prof.samples) == ["S", "T", "block", "embed", "head"]
    for kind, values in prof.samples.items():
        assert len(values) == 3 and all(v > 0 for v in values)
        assert getattr(prof, kind) == statistics.median(values)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_redistribution_is_the_unbalanced_1f1b_closed_form_with_the_head_alone_last(ranks):
    m = 2 * ranks
    row = {r["method"]: r for r in vs.method_table(PROFILE, ranks, m, 2)}["redistribution"]
    _, costs, bounds = vs.plan(PROFILE, "redistribution", ranks, m, 2)
    stage = [3 * f for f in costs.F]                       # F + I + W of each stage
    assert row["step"] == pytest.approx(sum(stage) + (m - 1) * max(stage))
    last = ranks * 2 + 1                                    # the head's index in the flat layer list
    assert bounds[-1] == (last, last + 1) and row["busy"][-1] == pytest.approx(m * PROFILE.head)


@pytest.mark.parametrize("name", ["vocab-1", "vocab-2"])
def test_vocabulary_parallel_ranks_each_do_their_blocks_and_one_shard(name):
    ranks, m = 4, 8
    row = {r["method"]: r for r in vs.method_table(PROFILE, ranks, m, 2)}[name]
    per_rank = m * (2 * PROFILE.block + (PROFILE.S + PROFILE.T) / ranks)
    assert row["busy"] == pytest.approx([per_rank] * ranks)


def test_vocab_explorer_draws_in_the_kernel_and_redraws(monkeypatch):
    """Drawn as soon as it is built, kernel-side (`with out:` can hang a headless executor, so
    any use fails here), and redrawn for the ranks the slider picks."""
    import ipywidgets as w
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipelab.views import ui

    def captured(*_):
        raise AssertionError("output routed through the Output widget")
    monkeypatch.setattr(w.Output, "__enter__", captured)
    box = vs.vocab_explorer({32768: PROFILE}, ranks=4, microbatches=8, blocks_per_rank=1)
    at_4 = ui.text_of(box.out)
    assert at_4 == vs.format_rows(vs.method_table(PROFILE, 4, 8, 1)) + "\n"
    box.children[1].value = 2                   # the ranks slider
    assert not [o for o in box.out.outputs if o["output_type"] == "error"]
    assert ui.text_of(box.out) == vs.format_rows(vs.method_table(PROFILE, 2, 8, 1)) + "\n" != at_4
    plt.close("all")
