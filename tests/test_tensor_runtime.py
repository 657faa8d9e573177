"""Tensor × pipeline parallelism live: 2 pipeline ranks × 2 tensor-parallel shards, exact
against the unsplit model; every TP all-reduce on the timeline; STP's braided units (forwards,
and backwards' input gradients) launch theirs asynchronously, interleaved with the partner's."""
from __future__ import annotations

import pytest

import pipelab as pl

pytestmark = pytest.mark.timeout(240)

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=8)
SCHEDULES = {"1f1b": 4, "zb-v": 5, "stp": 5}


@pytest.fixture(scope="module")
def runs(clusters):
    cluster = clusters(4)
    return {name: cluster.run(pl.schedule(name, ranks=2, microbatches=m), model=CFG,
                              tensor_parallel=2)
            for name, m in SCHEDULES.items()}


def blocks_in(res, stage: int) -> int:
    """Transformer blocks in a stage (layers 1..n_layers of the flat list)."""
    return sum(1 for i in range(*res.spec.bounds[stage]) if 1 <= i <= CFG.n_layers)


def blocks_of(res, rank: int) -> int:
    return sum(blocks_in(res, s) for s in res.schedule.stages_of(rank))


@pytest.mark.parametrize("name", SCHEDULES)
def test_two_by_two_is_exact_against_the_unsplit_model(runs, name):
    res = runs[name]
    assert res.mesh.size == 4 and res.mesh.tp == 2
    assert res.max_grad_error < 1e-5
    assert abs(res.loss - res.reference_loss) <= 1e-5 * abs(res.reference_loss)


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_tp_all_reduce_is_an_event_on_the_communication_lane(runs, name):
    res = runs[name]
    m = res.schedule.microbatches
    for rank in range(2):
        events = [e for e in res.timeline.comm_events() if e.rank == rank]
        # Two per block in each forward and two in each input-gradient pass.
        assert len(events) == 4 * m * blocks_of(res, rank)
        assert all(e.action.kind == "Tp" and e.duration > 0 for e in events)
        # Each lies inside the compute step that ran it (measured on the same clock).
        steps = [e for e in res.timeline.events_of(rank) if e.action.kind != "Tp"]
        for e in events:
            assert any(s.start <= e.start and e.end <= s.end + 1e-4 and
                       any(p.stage == e.action.stage and p.microbatch == e.action.microbatch
                           for p in s.action.parts) for s in steps)


def test_stp_braided_forwards_launch_their_all_reduces_asynchronously(runs):
    res = runs["stp"]
    for rank in range(2):
        expected = sum(2 * blocks_in(res, p.stage) for item in res.schedule.actions[rank]
                       if len(item.parts) > 1 for p in item.parts if p.kind == "F")
        launched = [what for *_x, what in res.tp_all_reduces[rank] if what == "forward, async"]
        assert len(launched) == expected > 0
    # Unbraided schedules wait for every all-reduce where it is launched.
    plain = runs["1f1b"].tp_all_reduces
    assert all(what != "forward, async" for rank in (0, 1) for *_x, what in plain[rank])


def test_stp_braided_backwards_launch_their_all_reduces_asynchronously_between_the_forwards(runs):
    """In F+B and F+I the backward's input-gradient all-reduces are async, and the forward's
    launches fall between them: each side computes while the other's sum travels."""
    res = runs["stp"]
    braids = 0
    for rank in range(2):
        for item in res.schedule.actions[rank]:
            back = [p for p in item.parts if p.kind in "BI"]
            if len(item.parts) < 2 or not back or blocks_in(res, back[0].stage) == 0:
                continue
            fwd = [p for p in item.parts if p.kind == "F"]
            launches = sorted((s, part, what) for part, s, _e, what in res.tp_all_reduces[rank]
                              if part in item.parts)
            mine = [what for _s, part, what in launches if part == back[0]]
            assert mine == ["backward, async"] * (2 * blocks_in(res, back[0].stage))
            order = [part for _s, part, _w in launches]
            first, last = order.index(back[0]), len(order) - 1 - order[::-1].index(back[0])
            if fwd and blocks_in(res, fwd[0].stage):
                assert fwd[0] in order[first:last], f"{item}: the backward ran whole"
                braids += 1
    assert braids > 0
    plain = runs["1f1b"].tp_all_reduces
    assert all(what != "backward, async" for rank in (0, 1) for *_x, what in plain[rank])
