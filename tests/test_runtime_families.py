"""Interleaved 1F1B, looped BFS and the zero-bubble schedules run live, several stages per rank
and split backwards included, and compute exactly what the unsplit model computes.

One LocalCluster per rank count, shared by the module (`clusters` in conftest.py).
"""
from __future__ import annotations

import pytest

import pipelab as pl

CFG = pl.ModelConfig(n_layers=6, d_model=32, n_heads=4, seq_len=16)   # 8 layers in all


# (schedule, ranks, microbatches, options, partition): stages = ranks × chunks; None = uniform.
CONFIGS = [
    ("interleaved-1f1b", 2, 4, {"chunks": 2}, None),
    ("interleaved-1f1b", 2, 4, {"chunks": 3}, [(0, 1), (1, 2), (2, 4), (4, 5), (5, 7), (7, 8)]),
    ("interleaved-1f1b", 3, 6, {"chunks": 2}, [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 8)]),
    ("looped-bfs", 2, 3, {"chunks": 2}, [(0, 3), (3, 4), (4, 5), (5, 8)]),
    ("looped-bfs", 4, 4, {"chunks": 2}, None),                       # one layer per stage
    ("zb-h1", 2, 4, {}, None),
    ("zb-h1", 4, 6, {}, [(0, 1), (1, 4), (4, 6), (6, 8)]),
    ("zb-h2", 2, 3, {}, [(0, 5), (5, 8)]),
    ("zb-h2", 3, 5, {}, [(0, 2), (2, 3), (3, 8)]),
    ("zb-v", 2, 3, {}, [(0, 1), (1, 4), (4, 6), (6, 8)]),
    ("zb-v", 3, 5, {}, None),
]


@pytest.mark.parametrize("name,ranks,microbatches,options,bounds", CONFIGS,
                         ids=[f"{c[0]}-p{c[1]}-m{c[2]}-{'uneven' if c[4] else 'uniform'}"
                              f"{'-v' + str(c[3]['chunks']) if c[3] else ''}" for c in CONFIGS])
def test_gradients_match_the_unsplit_model(clusters, name, ranks, microbatches, options, bounds):
    sched = pl.schedule(name, ranks=ranks, microbatches=microbatches, **options)
    res = clusters(ranks).run(sched, model=CFG, partition=bounds, seed=7)
    if bounds is not None:
        assert res.spec.bounds == bounds
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    assert len(res.grad_errors) == len(list(pl.ToyGPT(CFG).parameters()))
    assert len(res.losses) == microbatches
    # Every rank ran its actions in the schedule's order.
    for rank in range(ranks):
        assert [e.action for e in res.timeline.events_of(rank)] == sched.actions[rank]
