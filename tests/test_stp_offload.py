"""STP with activation offload (the STP paper's memory variant): where the offload/reload pairs
go, the simulated copies on the rank's copy lane, and a live 2 × 2 run whose rank-0 peak falls
while the loss and every gradient stay those of plain STP."""
from __future__ import annotations

import math

import pytest

import pipelab as pl
from pipelab.runtime.spec import prepare_run
from pipelab.schedules.kinds import OFFLOAD, RELOAD

P, M = 2, 9                     # the authors' offload figure (figs/offload_schedule.jpg)


def unit(**extra) -> pl.Costs:
    return pl.Costs.per_stage(F=1, I=1, W=1, **extra)


def copies(bandwidth: float) -> pl.Costs:
    """Unit compute; each offload or reload copies 1 byte at `bandwidth` bytes per unit."""
    return unit(activation_bytes=1, offload_bandwidth=bandwidth)


def position(acts: list, kind: str, stage: int, mb: int) -> int:
    return next(i for i, item in enumerate(acts) for part in item.parts
                if (part.kind, part.stage, part.microbatch) == (kind, stage, mb))


@pytest.mark.parametrize("fraction, chosen", [(1, list(range(M))), (0.5, [1, 3, 5, 7]),
                                               (0.25, [3, 7]), (0, [])])
def test_pairs_sit_after_the_forward_and_one_compute_step_before_the_backward(fraction, chosen):
    s = pl.schedule("stp", ranks=P, microbatches=M, offload=fraction)
    plain = pl.schedule("stp", ranks=P, microbatches=M)
    for r, acts in enumerate(s.actions):
        copies_here = [a for a in acts if a.kind in (OFFLOAD, RELOAD)]
        compute = [a for a in acts if a.kind not in (OFFLOAD, RELOAD)]
        assert compute == plain.actions[r]                 # the braided order is untouched
        # Only chunk 0 (stage r), whose activations wait 3p−1−r steps: the authors' choice.
        assert sorted(a.microbatch for a in copies_here if a.kind == OFFLOAD) == chosen
        assert {a.stage for a in copies_here} <= {r}
        for mb in chosen:
            off, re = position(acts, OFFLOAD, r, mb), position(acts, RELOAD, r, mb)
            forward = position(acts, "F", r, mb)
            back = min(position(acts, k, r, mb) for k in "BI" if any(
                p.kind == k and p.stage == r and p.microbatch == mb for a in acts for p in a.parts))
            assert all(a.kind == OFFLOAD for a in acts[forward + 1:off + 1])
            # between the reload and its backward: exactly one compute step
            between = [a for a in acts[re + 1:back] if a.kind not in (OFFLOAD, RELOAD)]
            assert len(between) == 1, (r, mb, acts[re:back + 1])


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half", math.nan, None])
def test_bad_offload_is_refused_with_the_rule(bad):
    with pytest.raises(ValueError, match="offload must be a number from 0 to 1"):
        pl.schedule("stp", ranks=P, microbatches=M, offload=bad)


def test_costs_refuse_a_bad_offload_bandwidth():
    for bad in (0, -1.0, True, "fast"):
        with pytest.raises(ValueError, match="offload_bandwidth must be a number"):
            pl.Costs(offload_bandwidth=bad)
    assert pl.Costs(activation_bytes=50e9).for_schedule(
        pl.schedule("1f1b", ranks=2, microbatches=2)).offload_time(0) == 2.0   # 50 GB at 25 GB/s


def test_copies_run_on_the_copy_lane_and_cost_nothing_while_they_fit():
    plain = pl.simulate(pl.schedule("stp", ranks=P, microbatches=M), unit())
    tl = pl.simulate(pl.schedule("stp", ranks=P, microbatches=M, offload=1), copies(2.0))
    lane = tl.side_events("copy")
    assert {e.action.kind for e in lane} == {OFFLOAD, RELOAD} and not tl.comm_events()
    assert len(lane) == 2 * P * M and all(e.duration == 0.5 for e in lane)
    # Half-unit copies hide under the compute: the same makespan and busy time as plain STP.
    assert tl.makespan == plain.makespan == 6 * M + P - 1
    assert tl.busy() == plain.busy()
    assert any(c.start < e.end and e.start < c.end for c in lane for e in tl.events
               if e.rank == c.rank and e not in lane)


def test_reload_is_issued_by_the_compute_and_its_backward_waits_for_it():
    s = pl.schedule("stp", ranks=P, microbatches=M, offload=1)
    tl = pl.simulate(s, copies(0.4))                 # 2.5-unit copies: longer than a step
    by_action = {part: e for e in tl.events for part in e.action.parts}
    for r, acts in enumerate(s.actions):
        for i, item in enumerate(acts):
            if item.kind != RELOAD:
                continue
            issued = next(a for a in reversed(acts[:i]) if a.kind not in (OFFLOAD, RELOAD))
            back = next(p for a in acts[i:] for p in a.parts
                        if p.kind in "BI" and (p.stage, p.microbatch) == (item.stage, item.microbatch))
            assert by_action[item].start >= by_action[issued.parts[-1]].end
            assert by_action[back].start >= by_action[item].end
    # Now the copies bind: the backwards wait, and the step takes longer than plain STP.
    assert tl.makespan > 6 * M + P - 1


def test_a_reload_after_its_backward_is_a_deadlock():
    s = pl.schedule("stp", ranks=P, microbatches=5, offload=1)
    acts = list(s.actions[0])
    re = position(acts, RELOAD, 0, 0)
    item = acts.pop(re)
    acts.insert(position(acts, "B", 0, 0) + 1, item)
    late = pl.Schedule([acts, s.actions[1]], placement=s.placement, microbatches=5, name="late")
    with pytest.raises(pl.ScheduleError, match="0Re0"):
        late.validate()


def test_simulated_peak_falls_with_the_share_offloaded():
    peaks = {f: pl.simulate(pl.schedule("stp", ranks=P, microbatches=M, offload=f),
                            copies(2.0)).peak_activations() for f in (0, 0.5, 1)}
    # Plain STP: 3p chunk-forwards live, one more inside a braided step (in rank units: /2).
    assert peaks[0] == {0: (3 * P + 1) / 2, 1: (3 * P + 1) / 2}
    # Fully offloaded, rank 0 keeps chunk 1's (at most 2 inside a braided step) and at most
    # two of chunk 0: one reloaded for its backward, one just made and being copied out.
    assert peaks[1][0] == 2.0
    assert all(peaks[1][r] < peaks[0.5][r] < peaks[0][r] for r in range(P))


# --- live: 2 pipeline ranks × 2 tensor shards ------------------------------------------------
@pytest.fixture(scope="module")
def live(clusters):
    cfg = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)
    cluster = clusters(4)
    return {f: cluster.run(pl.schedule("stp", ranks=2, microbatches=5, offload=f), model=cfg,
                           tensor_parallel=2, progress=False) for f in (0, 1)}


def test_full_offload_cuts_rank0_measured_peak_by_a_quarter_and_stays_exact(live):
    plain, off = live[0], live[1]
    assert off.peak_activations[0] <= 0.75 * plain.peak_activations[0]
    assert off.max_grad_error <= 1e-5 and off.loss == plain.loss
    # The copies are bit-exact: every gradient is plain STP's, to the last bit.
    assert off.grad_errors == plain.grad_errors
    # Offloaded bytes are counted apart; plain STP offloads none.
    assert plain.offloaded_bytes == {0: 0, 1: 0} and all(off.offloaded_bytes.values())
    kinds = {e.action.kind for e in off.timeline.side_events("copy")}
    assert {OFFLOAD, RELOAD} <= kinds


def test_offload_and_reload_move_one_forwards_bytes_out_of_and_back_into_the_meter(live):
    off = live[1]
    acts = off.schedule.actions[0]
    levels = [level for _t, level in off.memory[0]]        # live bytes after each step
    change = dict(zip(acts, (b - a for a, b in zip(levels, levels[1:]))))
    forward = change[acts[0]]                               # 0F0: one chunk-0 forward's bytes
    assert forward > 0
    assert [change[a] for a in acts if a.kind == OFFLOAD] == [-forward] * 5
    assert [change[a] for a in acts if a.kind == RELOAD] == [forward] * 5
    # Held off the device at most: the microbatches between their offload and their reload.
    away = most = 0
    for a in acts:
        away += (a.kind == OFFLOAD) - (a.kind == RELOAD)
        most = max(most, away)
    assert off.offloaded_bytes[0] == most * forward


def test_offload_with_recomputation_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="recompute='full' with an offloading schedule"):
        prepare_run(pl.schedule("stp", ranks=P, microbatches=5, offload=1), ranks=P,
                    recompute="full")
    prepare_run(pl.schedule("stp", ranks=P, microbatches=5), ranks=P, recompute="full")


def test_copies_and_all_reduces_run_on_lanes_of_their_own():
    # A copy engine and the collectives' stream are separate: on a rank, an offload may run
    # while a tensor-parallel all-reduce does (sharing one lane, they would queue).
    tl = pl.simulate(pl.schedule("stp", ranks=P, microbatches=M, offload=1),
                     unit(tp_allreduce=0.5, activation_bytes=1.0, offload_bandwidth=2.0))
    copy, comm = tl.side_events("copy"), tl.comm_events()
    assert copy and comm and {e.action.kind for e in comm} == {"Tp"}
    assert any(c.rank == a.rank and c.start < a.end and a.start < c.end
               for c in copy for a in comm)
