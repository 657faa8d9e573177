"""MoE inside the pipeline, live: plain PP, expert parallelism (EP 2) and EP × PP (2 × 2), exact
against the unsplit model on the whole batch; routing counts, all-to-all events, the stuck
all-to-all and the refused configurations."""
from __future__ import annotations

import pytest
import torch

import pipelab as pl
from pipelab.techniques.expert_routing import Routing, balanced, expert_share, routed_costs

pytestmark = pytest.mark.timeout(300)

CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8, n_experts=4, top_k=2,
                     capacity_factor=1.0, aux_loss_coef=0.05)


def exact(res) -> None:
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert abs(res.loss - res.reference_loss) <= 1e-5 * abs(res.reference_loss)


def test_pipeline_without_ep_is_exact(clusters):
    # Each microbatch holds 1/m of the aux loss: its gradient must be scaled like the loss's.
    res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG)
    exact(res)
    assert res.routing[0].routed.shape == (4, 2, 4)
    assert not res.timeline.comm_events()          # no expert parallelism: no all-to-all


def test_full_recomputation_of_moe_blocks_is_exact(clusters):
    # The recomputed forward must route every token exactly as the first one did (the
    # backward reuses the first forward's graph with the recomputed tensors).
    res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG,
                          recompute="full")
    exact(res)


def test_expert_parallel_2_is_exact_and_keeps_expert_gradients_local(clusters):
    res = clusters(2).run(pl.schedule("gpipe", ranks=1, microbatches=2), model=CFG,
                          expert_parallel=2)
    exact(res)
    assert res.data_parallel == 2 and res.spec.expert_parallel == 2
    # every expert's gradient came from the process that holds it (dp 1 holds experts 2, 3)
    assert res.grad_errors["layers.1.moe.experts.3.up.weight"] <= 1e-5


@pytest.fixture(scope="module")
def grid(clusters):
    return clusters(4)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_ep_by_pp_two_by_two_is_exact(grid, name):
    res = grid.run(pl.schedule(name, ranks=2, microbatches=4), model=CFG, expert_parallel=2)
    exact(res)
    # On every process's communication lane: a dispatch and a combine all-to-all per MoE
    # layer in each forward and again in each backward (one block per stage here).
    for (pp, dp), tl in res.process_timelines.items():
        lane = [e.action for e in tl.comm_events() if e.action.kind in ("Ed", "Ec")]
        assert sorted({a.kind for a in lane}) == ["Ec", "Ed"]
        assert len(lane) == 4 * 4, (pp, dp, lane)          # 4 microbatches × (F, B) × 2
        assert {a.stage for a in lane} == {pp}
        assert all(e.end >= e.start for e in tl.comm_events())


def test_routing_is_recorded_per_step_and_microbatch(grid):
    steps, m = 2, 4
    res = grid.run(pl.schedule("1f1b", ranks=2, microbatches=m), model=CFG, expert_parallel=2,
                   steps=steps, lr=1e-2, progress=False, check=False)
    assert len(res.routing) == steps
    rows = res.spec.rows_per_microbatch
    model = pl.ToyGPT(CFG)
    inputs, _ = pl.get_batch(res.spec.batch_size, CFG.seq_len,
                             generator=torch.Generator().manual_seed(res.spec.seed))
    first = res.routing[0]
    assert first.layers == [1, 2]
    # every microbatch of both replicas: rows × seq tokens × k assignments per layer
    assert (first.routed.sum(-1) == 2 * rows * CFG.seq_len * CFG.top_k).all()
    # ... and exactly the single-process model's decisions on the same rows
    for mb in range(m):
        share = torch.cat([inputs[d * m * rows + mb * rows:d * m * rows + (mb + 1) * rows]
                           for d in range(2)])
        model(share)
        for i, layer in enumerate(first.layers):
            r = model.layers[layer].moe.last
            assert first.routed[mb, i].tolist() == r.routed.sum(0).tolist()
            assert first.dropped[mb, i].tolist() == r.dropped.sum(0).tolist()
    assert first.dropped_tokens() > 0                        # capacity 1.0 drops some
    assert not torch.equal(res.routing[1].routed, first.routed)   # the router trained


def test_a_stuck_all_to_all_times_out_naming_the_processes(grid):
    with pytest.raises(pl.PipelineTimeout) as err:
        grid.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, expert_parallel=2,
                 timeout=3.0, _inject={"stall": "1F2", "replica": 1})
    text = str(err.value)
    assert "pp 1 / dp 0 waits in an expert all-to-all inside 1F2" in text
    assert "pp 1 / dp 1 never joined it" in text
    res = grid.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG, expert_parallel=2)
    exact(res)                                   # the next run starts fresh workers


@pytest.mark.parametrize("kw,words", [
    (dict(model=CFG, expert_parallel=3), "expert_parallel=3 must divide ModelConfig.n_experts"),
    (dict(model=pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8),
          expert_parallel=2), "needs a mixture-of-experts model"),
    (dict(model=CFG, expert_parallel=2, data_parallel=4), "data_parallel must be 2"),
    (dict(model=CFG, expert_parallel=0), "expert_parallel must be a positive integer"),
])
def test_bad_expert_parallel_is_refused_before_any_process_starts(kw, words):
    cluster = pl.LocalCluster(ranks=4, start=False)
    with pytest.raises(ValueError, match=words):
        cluster.run(pl.schedule("1f1b", ranks=2, microbatches=4), **kw)
    assert cluster.pids == []


def _routing(loads) -> Routing:
    routed = torch.tensor(loads).view(len(loads), 1, -1)
    return Routing([1], routed, torch.zeros_like(routed))


def test_simulated_stage_costs_follow_the_busiest_expert_process():
    cfg = pl.ModelConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8, n_experts=4, top_k=1)
    sched = pl.schedule("1f1b", ranks=1, microbatches=2)
    bounds = [(0, 3)]
    share = expert_share(cfg, 0, 3)
    assert 0 < share < 1
    # 16 tokens, top-1: balanced is 4 per expert, 8 per process of an EP group of 2.
    even = _routing([[4, 4, 4, 4], [4, 4, 4, 4]])
    skew = _routing([[4, 4, 4, 4], [8, 8, 0, 0]])            # mb 1: process 0 runs 16
    costs = pl.Costs(F=1.0, I=1.0, W=1.0)
    same = routed_costs(sched, costs, cfg, bounds, even, expert_parallel=2)
    assert all(v == pytest.approx(costs.of(a.kind, 0)) for a, v in same.per_action.items())
    hot = routed_costs(sched, costs, cfg, bounds, skew, expert_parallel=2)
    assert hot.per_action[pl.Action(0, "F", 0)] == pytest.approx(1.0)
    assert hot.per_action[pl.Action(0, "F", 1)] == pytest.approx(1 + share)       # load × 2
    assert hot.per_action[pl.Action(0, "B", 1)] == pytest.approx(2 * (1 + share))
    # without expert parallelism one process runs all 16 either way: no change
    flat = routed_costs(sched, costs, cfg, bounds, skew, expert_parallel=1)
    assert flat.per_action[pl.Action(0, "F", 1)] == pytest.approx(1.0)
    assert balanced(skew, 1, 16).routed.tolist() == even.routed.tolist()


def test_expert_share_is_the_experts_flops_in_the_cost_profile():
    """The simulator's expert part is a FLOP share: k experts' worth of the stage's FLOPs, one
    expert's worth being what one more top-k choice adds to the cost profile."""
    base = dict(n_layers=2, d_model=16, n_heads=2, seq_len=8, n_experts=4)
    flops = {k: [r["flops"] for r in pl.layer_costs(pl.ModelConfig(**base, top_k=k))]
             for k in (1, 2)}
    one_expert = flops[2][1] - flops[1][1]
    assert one_expert > 0
    for start, stop in [(0, 2), (1, 3), (2, 4), (0, 4)]:
        blocks = sum(1 <= i <= 2 for i in range(start, stop))
        share = expert_share(pl.ModelConfig(**base, top_k=2), start, stop)
        assert share == pytest.approx(2 * blocks * one_expert / sum(flops[2][start:stop]))
