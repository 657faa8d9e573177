"""Notebook 10's helpers: the all-to-all volume the explorer prints, against the rows that an
expert-parallel forward would really move (counted on the tensors)."""
from __future__ import annotations

import pytest

import pipelab as pl
from pipelab.model import moe
from pipelab.chapters import moe_expert_parallelism as moe_lab

CFG = pl.ModelConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32, n_experts=4, top_k=2,
                     capacity_factor=1.25)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_all_to_all_formula_equals_the_bytes_counted_on_the_tensors(ep):
    model = pl.ToyGPT(CFG)
    batch = moe_lab.toy_batch(CFG, 8)
    formula = moe_lab.all_to_all_bytes(moe_lab.route(model, batch, microbatches=ep), CFG.d_model, ep)
    counted = moe_lab.sent_bytes(model, batch, ep)
    assert formula == counted
    assert (counted > 0) == (ep > 1)
    # the model is left as it was: every expert local again
    assert all(m.exchange is moe.LOCAL for m in model.modules() if isinstance(m, moe.MoEMLP))


def test_counted_bytes_follow_the_experts_placement():
    """More processes, more experts away from home: the volume grows with ep (each kept row
    stays home with probability 1/ep under this router)."""
    model = pl.ToyGPT(CFG)
    batch = moe_lab.toy_batch(CFG, 8)
    assert moe_lab.sent_bytes(model, batch, 2) < moe_lab.sent_bytes(model, batch, 4)


def test_routing_explorer_draws_in_the_kernel(monkeypatch):
    """Rendered kernel-side (`with out:` can hang a headless executor, so any use fails here),
    and redrawn when a slider moves."""
    import ipywidgets as w
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipelab.views import ui

    def captured(*_):
        raise AssertionError("output routed through the Output widget")
    monkeypatch.setattr(w.Output, "__enter__", captured)
    box = moe_lab.routing_explorer(CFG, rows=4)
    room = moe.capacity(CFG.seq_len, 4, 2, 1.25)
    assert ui.text_of(box.out).startswith(f"capacity ⌈1.25 · 32 · 2 / 4⌉ = {room} per expert")
    box.controls["capacity_factor"].value = 3.0
    assert not [o for o in box.out.outputs if o["output_type"] == "error"]
    assert ui.text_of(box.out).startswith("capacity ⌈3 · 32 · 2 / 4⌉ = 48 per expert")
    plt.close("all")
