"""The process mesh without processes: coordinates, the AR actions, their cost and overlap."""
from __future__ import annotations

import math

import pytest

import pipelab as pl
from pipelab.techniques import reduction_of
from pipelab.runtime import prepare_run

AR = reduction_of


def test_mesh_coordinates_round_trip_and_replica_zero_is_the_plain_pipeline():
    mesh = pl.Mesh(pp=2, dp=3)
    assert mesh.size == 6
    assert [mesh.coords(r) for r in range(6)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0),
                                                  (0, 2, 0), (1, 2, 0)]
    assert all(mesh.rank(*mesh.coords(r)) == r for r in range(6))
    assert mesh.dp_group(1) == (1, 3, 5) and mesh.pipeline(2) == (4, 5)
    assert list(mesh.groups()) == ["dp 0", "dp 1", "pipeline 0", "pipeline 1", "pipeline 2"]
    assert mesh.peer(3, 0) == 2                 # (pp 1, dp 1) talks to (pp 0, same dp)
    assert mesh.name(3) == "pp 1 / dp 1" and pl.Mesh(pp=2).name(1) == "rank 1"
    with pytest.raises(ValueError, match="outside"):
        mesh.rank(2, 0)
    with pytest.raises(ValueError, match="tp must be"):
        pl.Mesh(pp=2, dp=1, tp=0)


def test_each_stage_reduces_right_after_its_last_backward():
    s = pl.with_data_parallel(pl.schedule("1f1b", ranks=2, microbatches=4), 2)
    assert [a[-1] for a in s.actions] == [AR(0), AR(1)]
    assert s.data_parallel == 2 and "dp 2" in s.name
    zb = pl.with_data_parallel(pl.schedule("zb-h1", ranks=2, microbatches=4), 2)
    for acts in zb.actions:                     # after the last W, not the last I
        assert acts[-1].kind == "AR" and acts[-2].kind == "W"
    # Its edges order it after every W of its stage (B where the backward is not split).
    assert {d.kind for d in zb.dependencies(AR(1))} == {"W"}
    assert len(zb.dependencies(AR(1))) == 4
    il = pl.with_data_parallel(pl.schedule("interleaved-1f1b", ranks=2, microbatches=4,
                                           chunks=2), 2)
    r0 = [str(a) for a in il.actions[0]]
    assert r0.index("2AR") == r0.index("2B3") + 1 and r0[-1] == "0AR"   # mid-list, then last
    assert pl.Schedule.from_text(il.to_text(), placement=il.placement).actions == il.actions
    one = pl.schedule("gpipe", ranks=2, microbatches=2)
    assert pl.with_data_parallel(one, 1) is one
    with pytest.raises(ValueError, match="already has"):
        pl.with_data_parallel(s, 2)


def test_ring_all_reduce_cost():
    # A ring over n=4: 2(n-1) = 6 rounds, each one latency and 1/4 of the 1000 bytes.
    assert pl.allreduce_time(1000, 4, bandwidth=100, latency=0.5) == 6 * 0.5 + 6 * 250 / 100
    assert pl.allreduce_time(1000, 1, bandwidth=100, latency=0.5) == 0.0
    c = pl.Costs(bandwidth=1000, latency=1, parameter_bytes=[1000, 2000], replicas=2)
    assert c.of("AR", 0) == 2 * 1 + 1000 / 1000 and c.of("AR", 1) == 2 * 1 + 2000 / 1000
    assert pl.Costs(parameter_bytes=10).of("AR", 0) == 0.0        # one replica: free
    with pytest.raises(ValueError, match="bandwidth"):
        pl.Costs(bandwidth=0)


def test_the_last_stage_reduction_hides_in_the_cool_down_computed_by_hand():
    # 1F1B, p=2, m=2, F=I=W=1 (B=2). Compute: rank 1 ends 1B1 at 7, rank 0 ends 0B1 at 9.
    # AR costs 2(n-1)·latency + 2(n-1)/n·bytes/bw with n=2: stage 0 2·0.5 + 1000/1000 = 2,
    # stage 1 2·0.5 + 2000/1000 = 3.
    s = pl.with_data_parallel(pl.schedule("1f1b", ranks=2, microbatches=2), 2)
    tl = pl.simulate(s, pl.Costs(bandwidth=1000, latency=0.5, parameter_bytes=[1000, 2000]))
    spans = {str(e.action): (e.start, e.end) for e in tl.events}
    assert spans["1AR"] == (7.0, 10.0) and spans["0AR"] == (9.0, 11.0)
    assert tl.makespan == 11.0 and tl.compute_end() == 9.0
    overlap = tl.reduction_overlap()
    # 1AR: 2 of its 3 units run while rank 0 still computes; 0AR: none.
    assert overlap == {"total": 5.0, "hidden": 2.0, "exposed": 2.0, "hidden_share": 0.4}
    assert tl.busy() == {0: 6.0, 1: 6.0}            # the comm lane is not compute
    assert tl.bubble_fraction() == 1 - 12 / 22


def test_a_reduction_runs_beside_compute_not_before_it():
    base = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    plain = pl.simulate(base, pl.Costs.per_stage())          # 1 per stage, 50 bytes per stage
    tl = pl.simulate(pl.with_data_parallel(base, 2),
                     pl.Costs.per_stage(bandwidth=1, parameter_bytes=50))
    # 2AR (rank 0) starts with 0B2 and lasts 50 units, yet every compute action keeps its time.
    assert tl.compute_end() == plain.makespan == 27.0
    starts = {str(e.action): e.start for e in tl.events}
    assert starts["2AR"] <= starts["0B2"] < starts["2AR"] + 50
    assert all(starts[str(e.action)] == e.start for e in plain.events)
    assert math.isclose(tl.makespan, starts["0AR"] + 50)


def test_a_mismatched_mesh_is_refused_before_any_worker_moves():
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    with pytest.raises(ValueError, match=r"2 pipeline ranks × 2 data-parallel replicas = 4 "
                                         r"processes, but the cluster has 2"):
        prepare_run(sched, ranks=2, data_parallel=2)
    with pytest.raises(ValueError, match="multiple of data_parallel × microbatches = 8"):
        prepare_run(sched, ranks=4, data_parallel=2, batch_size=12)
    lazy = pl.LocalCluster(ranks=3, start=False)
    with pytest.raises(ValueError, match="the cluster has 3"):
        lazy.run(sched, data_parallel=2)
    assert lazy.pids == []
    spec = prepare_run(sched, ranks=4, data_parallel=2)
    assert spec.batch_size == 16 and spec.rows_per_microbatch == 2
    assert [a[-1] for a in spec.schedule.actions] == [AR(0), AR(1)]
    assert prepare_run(sched, ranks=2).schedule is sched      # dp 1: nothing inserted


def test_the_grid_shows_every_reduction_in_a_cell_of_its_own():
    il = pl.with_data_parallel(pl.schedule("interleaved-1f1b", ranks=2, microbatches=4,
                                           chunks=2), 2)
    text = str(il)
    assert all(f"{s}AR" in text for s in range(4))
