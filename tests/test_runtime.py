"""The multi-process runtime computes what the unsplit model computes, and measures it honestly.

One LocalCluster per rank count, shared by the module (`clusters` in conftest.py).
"""
from __future__ import annotations

import statistics

import pytest
import torch

import pipelab as pl

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)   # 6 layers in all


def assert_exact(res: pl.RunResult) -> None:
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)


def reference_microbatch_losses(res: pl.RunResult) -> list[float]:
    """Each microbatch's loss under the unsplit model, from the batch the run was given."""
    spec = res.spec
    x, y = pl.get_batch(spec.batch_size, spec.cfg.seq_len,
                        generator=torch.Generator().manual_seed(spec.seed))
    model = pl.ToyGPT(spec.cfg)
    with torch.no_grad():
        return [model.loss(px, py).item()
                for px, py in pl.split_microbatches(x, y, spec.schedule.microbatches)]


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (3, 6), (4, 8)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gradients_match_the_unsplit_model(clusters, name, ranks, microbatches):
    sched = pl.schedule(name, ranks=ranks, microbatches=microbatches)
    res = clusters(ranks).run(sched, model=CFG, seed=3)
    assert_exact(res)
    # Per microbatch, in order: a microbatch's loss reported under another's number (which the
    # batch loss and the summed gradients cannot see) fails here.
    assert res.losses == pytest.approx(reference_microbatch_losses(res), rel=1e-6)


def forward_bytes(cfg, bounds, stage: int, held: int, rows: int = 2) -> int:
    """Activation bytes layers bounds[stage] keep alive after `held` forwards, counted in this
    process: the stage built on its own from the partition, not taken from the run."""
    from pipelab.model.gpt import loss_fn
    from pipelab.runtime.meter import ActivationMeter
    layers = pl.build_layers(cfg, *bounds[stage])
    meter, kept = ActivationMeter(layers.parameters()), []
    for mb in range(held):                     # each microbatch's own tokens and targets
        x, y = pl.get_batch(rows, cfg.seq_len, seed=mb)
        inp = x if stage == 0 else torch.randn(rows, cfg.seq_len, cfg.d_model, requires_grad=True)
        with meter.saving():
            out = layers(inp)
            kept.append(loss_fn(out, y) if stage == len(bounds) - 1 else out)
    return meter.live


@pytest.mark.parametrize("bounds", [[(0, 5), (5, 6)], [(0, 1), (1, 6)]])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_uneven_partitions_two_ranks(clusters, name, bounds):
    res = clusters(2).run(pl.schedule(name, ranks=2, microbatches=4), model=CFG, partition=bounds)
    assert_exact(res)          # (exact whatever the split: it cannot tell which split ran)
    # Each rank holds the activations of its own layers: GPipe all 4 microbatches, 1F1B
    # min(p - rank, m). A rank that ran another split than asked would hold other bytes.
    held = {0: 4, 1: 4} if name == "gpipe" else {0: 2, 1: 1}
    assert res.peak_activations == {r: forward_bytes(CFG, bounds, r, held[r]) for r in (0, 1)}


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_uneven_partitions_three_ranks(clusters, name):
    bounds = [(0, 1), (1, 5), (5, 6)]
    res = clusters(3).run(pl.schedule(name, ranks=3, microbatches=6), model=CFG,
                          partition=pl.Partition(CFG, bounds, "custom"))
    assert_exact(res)
    held = {r: 6 if name == "gpipe" else 3 - r for r in range(3)}
    assert res.peak_activations == {r: forward_bytes(CFG, bounds, r, held[r]) for r in range(3)}
    by_method = clusters(3).run(pl.schedule(name, ranks=3, microbatches=3), model=CFG,
                                partition="params")
    assert by_method.spec.bounds == pl.partition(CFG, 3, "params").bounds
    assert_exact(by_method)


def test_split_backward_and_two_stages_per_rank(clusters):
    """I/W kinds and stages handed over in memory on one rank are exact too."""
    m = 4
    rows = [" ".join([f"{s}F{i}" for i in range(m)] + [f"{s}{k}{i}" for i in range(m) for k in "IW"])
            for s in range(2)]
    split = pl.Schedule.from_text("\n".join(rows), microbatches=m)
    looped = pl.Schedule.from_text(
        "\n".join(" ".join([f"{a}F{i}" for i in range(m)] + [f"{b}F{i}" for i in range(m)] +
                           [f"{b}B{i}" for i in range(m)] + [f"{a}B{i}" for i in range(m)])
                  for a, b in ((0, 2), (1, 3))), placement=[0, 1, 0, 1], microbatches=m)
    for sched in (split, looped):
        assert_exact(clusters(2).run(sched, model=pl.ModelConfig(n_layers=6, d_model=32,
                                                                 n_heads=4, seq_len=16)))


def test_training_equals_single_process(clusters):
    steps, batch = 4, 8
    res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, steps=steps,
                          batch_size=batch, lr=1e-2, seed=5, progress=False)
    single = pl.train(CFG, steps=steps, batch_size=batch, lr=1e-2, seed=5, progress=False)
    assert len(res.loss_history) == steps
    assert res.loss_history == pytest.approx(single, rel=1e-5)
    assert res.loss_history[-1] < res.loss_history[0]          # it actually trained
    assert len(res.timelines) == steps and res.timeline is res.timelines[-1]


def test_timeline_is_measured_and_replayed(clusters):
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    res = clusters(2).run(sched, model=CFG)
    tl = res.timeline
    assert tl.source == "measured" and tl.memory_unit == "bytes"
    assert res.replay.source == "replayed" and res.simulated.source == "simulated"
    for rank in range(2):
        events = tl.events_of(rank)
        assert [e.action for e in events] == sched.actions[rank]   # in schedule order
        for e, nxt in zip(events, events[1:]):
            assert 0 <= e.start <= e.end <= nxt.start
            assert e.cpu is not None and 0 <= e.cpu <= e.duration * 1.5 + 1e-3
    # A forward on stage 1 starts after the forward on stage 0 that feeds it ended.
    end = {e.action: e.end for e in tl.events}
    for e in tl.events:
        for dep in sched.dependencies(e.action):
            assert e.start >= end[dep]
    # The replay runs each action for its measured CPU time; the simulated view for the median
    # CPU time of its kind on its stage.
    cpu = {e.action: e.cpu for e in tl.events}
    assert all(e.duration == pytest.approx(cpu[e.action]) for e in res.replay.events)
    for e in res.simulated.events:
        same = [c for a, c in cpu.items() if (a.kind, a.stage) == (e.action.kind, e.action.stage)]
        assert e.duration == pytest.approx(statistics.median(same))
    assert res.comm_latency > 0                                 # a message takes time
    assert set(res.recv_wait) == {0, 1}


def test_a_preempted_sender_still_ends_before_its_receiver_starts(clusters):
    # Rank 0 pauses 0.1 s right after posting 0F0's send (as a process descheduled at load
    # does): rank 1 receives and starts 1F0 meanwhile. The measured span of 0F0 is its
    # compute, so it ends before the pause, and every consumer starts after its producers end.
    sched = pl.schedule("1f1b", ranks=2, microbatches=2)
    res = clusters(2).run(sched, model=CFG, _inject={"lag": "0F0"})
    ev = {e.action: e for e in res.timeline.events}
    for e in res.timeline.events:
        for dep in sched.dependencies(e.action):
            assert e.start >= ev[dep].end, (dep, e.action)
    # The pause lies outside 0F0's span: rank 0's next action starts after it.
    after = res.timeline.events_of(0)[1]
    assert after.start - ev[pl.Action.parse("0F0")].end >= 0.1


def _units(res: pl.RunResult, rank: int) -> float:
    """Peak live bytes over the bytes one microbatch leaves alive after one forward."""
    curve = res.memory[rank]
    first_forward = next(e for e in res.timeline.events_of(rank) if e.action.kind == "F")
    one = next(level for t, level in curve if t >= first_forward.end - 1e-12)
    return res.peak_activations[rank] / one


def test_activation_memory_follows_the_textbook(clusters):
    p, m = 4, 8
    gpipe = clusters(p).run(pl.schedule("gpipe", ranks=p, microbatches=m), model=CFG)
    ofob = clusters(p).run(pl.schedule("1f1b", ranks=p, microbatches=m), model=CFG)
    for rank in range(p):
        assert _units(gpipe, rank) == pytest.approx(m)
        assert _units(ofob, rank) == pytest.approx(min(p - rank, m))
        assert gpipe.memory[rank][-1][1] == 0          # everything freed by the last backward


def test_result_prints_a_table(clusters):
    res = clusters(2).run(pl.schedule("gpipe", ranks=2, microbatches=2), model=CFG)
    text = repr(res)
    for needle in ("measured", "replayed", "simulated", "makespan", "bubble fraction",
                   "max grad error", "peak activations", "reference"):
        assert needle in text
    # The columns are what their headers say: measured, replayed, simulated, in that order.
    row = next(line for line in text.splitlines() if line.startswith("makespan (ms)"))
    shown = [float(v) for v in row.split()[2:]]
    views = [res.timeline, res.replay, res.simulated]
    assert shown == [round(t.makespan * 1e3, 2) for t in views]
    assert f"max grad error {res.max_grad_error:.1e}" in text


def test_check_false_skips_the_reference(clusters):
    res = clusters(2).run(pl.schedule("gpipe", ranks=2, microbatches=2), model=CFG, check=False)
    assert res.reference_loss is None and res.max_grad_error is None
    assert "no reference check" in repr(res)


def test_a_warm_rerun_reuses_the_workers(clusters):
    # What makes a re-run fast is that nothing is started again; how fast it is on a quiet
    # machine is measured by benchmarks/pipeline_efficiency.py (target < 1 s).
    cluster = clusters(2)
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    cluster.run(sched, model=CFG)
    pids, starts = cluster.pids, cluster.starts
    for _ in range(3):
        res = cluster.run(sched, model=CFG)
        assert cluster.pids == pids and cluster.starts == starts
    assert res.max_grad_error <= 1e-5


def _metered_forward(first: int, last: int):
    """A forward of layers [first, last) under a fresh meter: (layer, input, meter, output)."""
    from pipelab.runtime.meter import ActivationMeter
    layer = pl.build_layers(CFG, first, last)
    x = torch.randn(2, CFG.seq_len, CFG.d_model, requires_grad=True)
    meter = ActivationMeter(layer.parameters())
    with meter.saving():
        out = layer(x)
    return layer, x, meter, out


def test_meter_counts_saved_activations_and_frees_them():
    from pipelab.runtime.meter import ActivationMeter

    layer, x, meter, out = _metered_forward(1, 2)
    held = meter.live
    assert held >= x.numel() * 4              # at least the block's input is kept
    counting_weights = ActivationMeter()      # the same forward, weights not excluded
    with counting_weights.saving():
        kept = layer(x)                       # keep the graph, or its saved tensors die at once
    # Autograd keeps every parameter but the Linear biases (addmm does not need them back).
    weights = sum(p.numel() * 4 for name, p in layer.named_parameters()
                  if not (name.endswith("bias") and ".ln" not in name))
    assert counting_weights.live - held == weights
    out.sum().backward()
    del kept
    assert counting_weights.live == 0
    assert meter.live == 0 and meter.peak == held


def test_meter_release_follows_autograd_per_tensor():
    """Split backward: input-gradient (graph kept) frees nothing, the weight pass frees all."""
    layer, x, meter, out = _metered_forward(1, 3)
    held = meter.live
    assert held > 0 and meter.peak == held
    grad = torch.ones_like(out)
    torch.autograd.grad(out, [x], grad, retain_graph=True)
    assert meter.live == held                      # the kept graph keeps its activations
    torch.autograd.backward(out, grad, inputs=list(layer.parameters()))
    assert meter.live == 0 and meter.peak == held
