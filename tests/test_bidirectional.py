"""Bidirectional pipelines: Chimera, DualPipe and DualPipeV.

Their closed forms in the simulator (docs/formulas.md: DeepSeek-V3's table, Chimera's slot count),
the schedule language's routes and weight replicas (text round trip, the validator's new
rules), DualPipeV against torch's ScheduleDualPipeV table, and live runs on 2 and 4 ranks that
compute exactly what the unsplit model computes.
"""
from __future__ import annotations

import re

import pytest

import pipelab as pl
from pipelab.schedules.routes import weight_copies, weight_share

CFG = pl.ModelConfig(n_layers=6, d_model=32, n_heads=4, seq_len=16)   # 8 layers in all
UNIT = pl.Costs(F=1, I=1, W=1)                                       # B = 2


def worst_idle(tl) -> float:
    """DeepSeek's bubble: the idle time of the rank that waits most (makespan − its busy time)."""
    return max(tl.idle().values())


# --- closed forms ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,ranks,microbatches", [
    ("dualpipe", 2, 4), ("dualpipe", 4, 8), ("dualpipe", 4, 14), ("dualpipe", 8, 20),
    ("dualpipe-v", 1, 2), ("dualpipe-v", 2, 6), ("dualpipe-v", 4, 8), ("dualpipe-v", 4, 11),
])
@pytest.mark.parametrize("overlap", [None, 0.0, 0.5])
@pytest.mark.parametrize("F,I,W", [(1, 1, 1), (1, 1, 0.5), (2, 2, 0.5)])
def test_dualpipe_bubble_is_deepseeks_table(name, ranks, microbatches, overlap, F, I, W):  # noqa: E741
    """(PP/2 − 1)(F&B + B − 3W), PP = stages (p for DualPipe, 2p for DualPipeV); F&B is F + B on
    a CPU (overlap=None), max(F, B) + overlap where a GPU would overlap the pair. Exact whenever
    a forward costs what an input-gradient pass costs and W ≤ I (the proportions of DeepSeek's
    figure), not only at F = I = W. DeepSeek's F, B, W are one chunk's: a per-stage table
    (for DualPipeV a chunk is half a rank's worth)."""
    costs = pl.Costs.per_stage(F=F, I=I, W=W, overlap=overlap)
    tl = pl.simulate(pl.schedule(name, ranks=ranks, microbatches=microbatches), costs)
    B = I + W
    pair = F + B if overlap is None else max(F, B) + overlap
    stages = ranks if name == "dualpipe" else 2 * ranks
    assert worst_idle(tl) == pytest.approx((stages / 2 - 1) * (pair + B - 3 * W))


@pytest.mark.parametrize("F,I,W,simulated,table", [
    (1, 1.5, 0.5, 3.0, 3.5),      # I > F: the schedule does better than the table
    (2, 1, 1, 4.0, 3.0),          # F > I: worse
    (1, 1, 2, 2.0, 1.0),          # W > I: a W no longer fits the gap the table credits it with
])
def test_dualpipe_table_is_a_count_of_one_figure_not_a_law(F, I, W, simulated, table):
    """Outside F = I ≥ W the table's expression is not the schedule's bubble. DeepSeek's own
    order gives the same figures (it is ours action for action, test below), so this is the
    formula being loose, not our schedule deviating. p = 4, m = 8, messages free."""
    from pipelab.chapters.bidirectional import dualpipe_bubble
    tl = pl.simulate(pl.schedule("dualpipe", ranks=4, microbatches=8), pl.Costs(F=F, I=I, W=W))
    assert worst_idle(tl) == pytest.approx(simulated)
    assert dualpipe_bubble(4, F, I, W) == pytest.approx(table)


@pytest.mark.parametrize("name,ranks,microbatches,chunk_peak,copies", [
    ("dualpipe", 4, 8, 5, 2), ("dualpipe", 8, 16, 9, 2),          # p + 1 chunks of 1/p
    ("dualpipe-v", 2, 4, 5, 1), ("dualpipe-v", 4, 10, 9, 1),      # PP + 1 chunks of 1/(2p)
])
def test_activation_peak_and_weights(name, ranks, microbatches, chunk_peak, copies):
    sched = pl.schedule(name, ranks=ranks, microbatches=microbatches)
    tl = pl.simulate(sched, UNIT)
    # The simulator counts a rank's worth of layers (1/p of the model); a chunk is 1/stages.
    per_chunk = sched.stages / sched.ranks / (sched.stages / sched.model_slices)
    assert {r: v * per_chunk for r, v in tl.peak_activations().items()} == \
        {r: chunk_peak for r in range(ranks)}
    assert weight_copies(sched) == copies
    assert set(weight_share(sched).values()) == {copies}


@pytest.mark.parametrize("ranks,microbatches", [(2, 2), (4, 4), (4, 12), (6, 6), (8, 8), (8, 24)])
def test_chimera_bubble_is_the_papers_slot_count(ranks, microbatches):
    """Direct concatenation: (p − 2)/(2m + p − 2) of the makespan with equal slots (F = B), and
    at most p microbatch-stages per rank, p/2 + 1 at the ends in a basic unit."""
    sched = pl.schedule("chimera", ranks=ranks, microbatches=microbatches, scaling="concat")
    tl = pl.simulate(sched, pl.Costs(F=1, I=0.5, W=0.5))
    p, m = ranks, microbatches
    assert tl.bubble_fraction() == pytest.approx((p - 2) / (2 * m + p - 2))
    peaks = tl.peak_activations()
    assert max(peaks.values()) == p
    if m == p:
        assert peaks[0] == peaks[p - 1] == p // 2 + 1
    assert weight_copies(sched) == 2


def test_chimera_halves_the_bubble_of_1f1b_and_dualpipe_beats_both():
    one = pl.simulate(pl.schedule("1f1b", ranks=8, microbatches=16), UNIT)
    chim = pl.simulate(pl.schedule("chimera", ranks=8, microbatches=16), pl.Costs(F=1, I=1, W=1))
    dual = pl.simulate(pl.schedule("dualpipe", ranks=8, microbatches=16), UNIT)
    assert worst_idle(one) == 7 * 3                    # (p − 1)(F + B)
    assert worst_idle(dual) == 3 * 2 < worst_idle(chim) < worst_idle(one)


# --- Chimera's scaling to m > p (§3.5): forward doubling against direct concatenation ------------

def test_chimera_doubling_beats_1f1b_where_concatenation_loses_to_it():
    """p = 4, m = 32, B = 2F: concatenated units leave intermediate bubbles (113 against 1F1B's
    105); doubled forwards leave none (p − 2 slots of B = 2 in all: 96 + 4)."""
    def makespan(name, **options):
        return pl.simulate(pl.schedule(name, ranks=4, microbatches=32, **options), UNIT).makespan
    assert makespan("chimera", scaling="concat") == 113
    assert makespan("1f1b") == 105
    assert makespan("chimera") == makespan("chimera", scaling="doubling") == 100


@pytest.mark.parametrize("ranks,microbatches", [(4, 8), (4, 32), (6, 12), (8, 16), (8, 32)])
def test_chimera_doubling_bubble_is_the_slot_count_of_doubled_units(ranks, microbatches):
    """At B = 2F a doubled forward lasts one backward: one slot. Each rank runs m/2 doubled
    forwards and m backwards, 3m/2 slots, and idles p − 2 of them as in the paper's basic unit
    (bubble fraction (p − 2)/(3m/2 + p − 2)), whatever the number of units. Its memory is the
    paper's "two times": 2p microbatch-stages on the busiest rank (direct concatenation: p)."""
    p, m = ranks, microbatches
    sched = pl.schedule("chimera", ranks=p, microbatches=m)
    tl = pl.simulate(sched, UNIT)
    assert tl.bubble_fraction() == pytest.approx((p - 2) / (3 * m / 2 + p - 2))
    assert tl.idle() == pytest.approx({r: 2 * (p - 2) for r in range(p)})
    assert max(tl.peak_activations().values()) == 2 * p
    concat = pl.simulate(pl.schedule("chimera", ranks=p, microbatches=m, scaling="concat"), UNIT)
    assert max(concat.peak_activations().values()) == p
    # every forward is doubled: two consecutive microbatches of one direction on one stage
    for acts in sched.actions:
        forwards = [a for a in acts if "F" in a.kind]
        assert forwards and all(a.kind == "F+F" for a in forwards)
        assert all(a[1].microbatch == a[0].microbatch + 1 and a[0].microbatch % 2 == 0
                   for a in forwards)


@pytest.mark.parametrize("ranks", [4, 6, 8])
def test_chimera_doubling_with_an_odd_number_of_units_runs_the_first_plain(ranks):
    """m = 3p: one plain basic unit, then a doubled one; (p/2 − 1)F more idle than the closed
    form, still below direct concatenation and 1F1B. At m = p both scalings are the basic unit."""
    p, m = ranks, 3 * ranks
    tl = pl.simulate(pl.schedule("chimera", ranks=p, microbatches=m), UNIT)
    assert max(tl.idle().values()) == 2 * (p - 2) + (p / 2 - 1)
    assert tl.makespan < min(
        pl.simulate(pl.schedule("chimera", ranks=p, microbatches=m, scaling="concat"),
                    UNIT).makespan,
        pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), UNIT).makespan)
    assert pl.schedule("chimera", ranks=p, microbatches=p) == \
        pl.schedule("chimera", ranks=p, microbatches=p, scaling="concat")


def test_overlap_must_be_a_time():
    with pytest.raises(ValueError, match="overlap"):
        pl.Costs(overlap=-1.0)


# --- DualPipeV is torch's ScheduleDualPipeV ---------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_dualpipe_v_equals_torchs_table(ranks):
    pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining import schedules
    if not hasattr(schedules, "ScheduleDualPipeV"):
        pytest.skip("this torch has no ScheduleDualPipeV")
    from pipelab.bench.torch_side import torch_table
    for m in (2 * ranks, 2 * ranks + 1, 2 * ranks + 4):
        ours = pl.schedule("dualpipe-v", ranks=ranks, microbatches=m)
        assert [[str(a) for a in acts] for acts in ours.actions] == \
            torch_table("ScheduleDualPipeV", ranks, m, chunks=2), (ranks, m)


def _relabel(row, stage, microbatch) -> list[str]:
    """A rank's steps with stages and microbatches renamed (a pair's two parts each)."""
    def one(part: str) -> str:
        s, kind, mb = re.fullmatch(r"(\d+)([A-Z][A-Za-z]*)(\d+)", part).groups()
        return f"{stage(int(s))}{kind}{microbatch(int(mb))}"
    return ["+".join(one(part) for part in str(a).split("+")) for a in row if a.kind != "G"]


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_dualpipe_is_dualpipe_v_unfolded(ranks):
    """DualPipe on 2p ranks, 2m microbatches: its first p ranks run DualPipeV(p, m)'s steps (the
    V's fold undone: stage 4p−1−r is 2p−1−r, the up stream's microbatch m + j is j), checked
    against torch's independent ScheduleDualPipeV table; its last p ranks run their mirror
    ranks' steps with the two directions swapped. Catches the DualPipe-only wiring: which chunk
    is 0 on which half, the route numbering, which stream's microbatches a chunk takes."""
    pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining import schedules
    if not hasattr(schedules, "ScheduleDualPipeV"):
        pytest.skip("this torch has no ScheduleDualPipeV")
    from pipelab.bench.torch_side import torch_table
    p = ranks
    for m in (2 * p, 2 * p + 1, 2 * p + 3):
        dual = pl.schedule("dualpipe", ranks=2 * p, microbatches=2 * m).actions
        torch_v = torch_table("ScheduleDualPipeV", p, m, chunks=2)
        for r in range(p):
            assert _relabel(dual[r], lambda s: s if s < 2 * p else s - 2 * p,
                            lambda j: j % m) == torch_v[r], (p, m, r)
            mirrored = _relabel(dual[r], lambda s: s + 2 * p if s < 2 * p else s - 2 * p,
                                lambda j: (j + m) % (2 * m))
            assert mirrored == _relabel(dual[2 * p - 1 - r], int, int), (p, m, r)


# --- constraints, named before anything runs ------------------------------------------------------

@pytest.mark.parametrize("name,ranks,microbatches,rule", [
    ("dualpipe", 3, 6, "even number of ranks"),
    ("dualpipe", 4, 9, "even number of microbatches"),
    ("dualpipe", 4, 6, "microbatches >= 2\\*ranks = 8"),
    ("dualpipe-v", 4, 7, "microbatches >= 2\\*ranks = 8"),
    ("chimera", 3, 6, "even number of ranks"),
    ("chimera", 4, 6, "multiple of ranks"),
    ("chimera", 4, 8, "scaling must be one of 'doubling', 'concat'"),
])
def test_constraints_name_the_rule(name, ranks, microbatches, rule):
    options = {"scaling": "halving"} if "scaling" in rule else {}
    with pytest.raises(ValueError, match=rule):
        pl.schedule(name, ranks=ranks, microbatches=microbatches, **options)


# --- routes and replicas in the schedule language ----------------------------------------------

def test_text_and_csv_round_trip_keep_routes_pairs_and_replica_sums():
    sched = pl.schedule("dualpipe", ranks=4, microbatches=8)
    back = pl.Schedule.from_text(sched.to_text())
    assert back == sched and back.routes == sched.routes and back.slices == sched.slices
    csv = pl.Schedule.from_csv(sched.to_csv(), placement=sched.placement, name="dualpipe",
                               routes=sched.routes, slices=sched.slices)
    assert csv == sched
    assert "0F3+7B5" in sched.to_csv()            # a pair is one cell


def _edit(sched, keep=lambda a: True, swap=None) -> pl.Schedule:
    """The schedule with some steps dropped (`keep`) or rewritten (`swap`: text -> text)."""
    rows = []
    for acts in sched.actions:
        row = [swap.get(str(a), str(a)) if swap else str(a) for a in acts if keep(a)]
        rows.append(" ".join(x for x in row if x))
    header = sched.to_text().splitlines()[0]
    return pl.Schedule.from_text("\n".join([header] + rows))


def test_a_replica_never_summed_is_rejected_with_the_grid():
    sched = pl.schedule("dualpipe", ranks=4, microbatches=8)
    broken = _edit(sched, keep=lambda a: str(a) != "1G")
    with pytest.raises(pl.ScheduleError, match="model part 1 has weight replicas .*never summed") \
            as err:
        broken.validate()
    assert "rank 0" in str(err.value) and "step |" in str(err.value)


def test_a_replica_sum_on_one_rank_only_is_a_collective_never_reached():
    sched = pl.schedule("chimera", ranks=4, microbatches=4)
    rows = [[str(a) for a in acts] for acts in sched.actions]
    rows[2].remove("1G")                       # rank 1 holds the other copy of part 1
    header = sched.to_text().splitlines()[0]
    with pytest.raises(pl.ScheduleError, match="rank 2 never reaches 1G"):
        pl.Schedule.from_text("\n".join([header] + [" ".join(r) for r in rows])).validate()


def test_a_pair_whose_backward_needs_its_own_forward_is_rejected():
    sched = pl.schedule("dualpipe-v", ranks=2, microbatches=4)
    # 0F3+3B1 is a real pair; 3F2+3B2 cannot overlap: the backward needs that very forward.
    broken = _edit(sched, swap={"3F2+0B0": "0B0", "3B2": "3F2+3B2"})
    with pytest.raises(pl.ScheduleError, match="pairs 3B2 with 3F2, which it needs first") as err:
        broken.validate()
    assert ">3F2+3B2<" in str(err.value).replace(" ", "")


def test_a_microbatch_on_two_routes_is_rejected():
    sched = pl.schedule("chimera", ranks=2, microbatches=2)
    # microbatch 0 goes down (stages 0, 1); make rank 1 run stage 2's forward of it too
    rows = [[str(a) for a in acts] for acts in sched.actions]
    rows[1] = ["2F0" if a == "2F1" else a for a in rows[1]]
    header = sched.to_text().splitlines()[0]
    with pytest.raises(pl.ScheduleError, match="microbatch 0 runs on stage .* a microbatch "
                                              "follows one route"):
        pl.Schedule.from_text("\n".join([header] + [" ".join(r) for r in rows])).validate()


@pytest.mark.parametrize("routes,slices,placement,rule", [
    (((0, 1), (2, 3)), (0, 1, 1, 0), (0, 1, 1, 0), "route 1 .* computes model parts \\[1, 0\\]"),
    (((0, 1), (1, 3)), (0, 1, 0, 1), (0, 1, 1, 0), "stage 1 is on route 0 and route 1"),
    (((0, 1), (2, 3)), (0, 1, 0, 1), (0, 1, 0, 1), "both compute model part 0 on rank 0"),
])
def test_routes_that_cannot_train_the_model_are_rejected(routes, slices, placement, rule):
    sched = pl.Schedule([[pl.Action.parse("0F0")], [pl.Action.parse("1F0")]], placement, 1,
                        routes=routes, slices=slices)
    with pytest.raises(pl.ScheduleError, match=rule):
        sched.validate()


# --- live: exact on 2 and 4 ranks ---------------------------------------------------------------

LIVE = [("dualpipe", 2, 4), ("dualpipe", 4, 8), ("dualpipe-v", 2, 4), ("dualpipe-v", 4, 8),
        ("chimera", 2, 4), ("chimera", 4, 8)]       # chimera: forward doubling, one doubled unit


@pytest.mark.parametrize("name,ranks,microbatches", LIVE, ids=[f"{n}-p{p}-m{m}" for n, p, m in LIVE])
def test_gradients_match_the_unsplit_model(clusters, name, ranks, microbatches):
    sched = pl.schedule(name, ranks=ranks, microbatches=microbatches)
    res = clusters(ranks).run(sched, model=CFG, seed=5)
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    assert len(res.losses) == microbatches
    for rank in range(ranks):
        assert [e.action for e in res.timeline.events_of(rank)] == sched.actions[rank]
    # Weights built per rank: a replica stage costs its part's bytes again.
    model_bytes = sum(p.numel() * 4 for p in pl.ToyGPT(CFG).parameters())
    assert sum(res.parameter_bytes.values()) == weight_copies(sched) * model_bytes


def test_explorer_overlap_switch_changes_the_pair_cost_and_the_closed_form():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipelab.chapters import bidirectional as bidir
    from pipelab.views.ui import text_of
    box = bidir.bidirectional_explorer(ranks=4, microbatches=8)
    box.controls["overlap"].value = True
    text = text_of(box.out)
    assert "idle time of the worst rank 1 (1F1B 9)" in text and "PP = 4: 1 " in text
    box.controls["overlap"].value = False
    text = text_of(box.out)
    assert "idle time of the worst rank 2 (1F1B 9)" in text and "PP = 4: 2 " in text
    box.controls["name"].value = "dualpipe-v"
    box.controls["microbatches"].value = 6                 # below 2p: refused, in words
    assert text_of(box.out).startswith("refused: dualpipe-v needs microbatches >= 2*ranks = 8")
    plt.close("all")


def test_explorer_switch_says_why_it_does_nothing():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipelab.chapters import bidirectional as bidir
    from pipelab.views.ui import text_of
    box = bidir.bidirectional_explorer(ranks=4, microbatches=8)
    switch = box.controls["overlap"]
    assert switch.description == bidir.OVERLAP_LABEL
    box.controls["microbatches"].value = 6                 # DualPipe needs m >= 2p: refused
    assert "this setting is refused" in switch.description
    assert "nothing to act on" in " ".join(text_of(box.out).split())
    box.controls["name"].value = "chimera"                 # m = 6 is no multiple of p: refused
    box.controls["microbatches"].value = 8
    assert "Chimera has no F&B pairs" in switch.description
    box.controls["name"].value = "dualpipe"
    assert switch.description == bidir.OVERLAP_LABEL
    plt.close("all")


def test_recomputation_keeps_the_routes_and_stays_exact(clusters):
    """A transform that rebuilds the schedule (here: R before every backward) keeps its routes
    and replicas, so a bidirectional schedule recomputes and still matches the unsplit model."""
    sched = pl.schedule("dualpipe", ranks=2, microbatches=4)
    res = clusters(2).run(sched, model=CFG, recompute="full", seed=2)
    assert res.spec.schedule.routes == sched.routes and "R" in res.spec.schedule.kinds()
    assert res.max_grad_error <= 1e-5, res.grad_errors
