"""pipelab.sim.compare: schedules side by side for the same model (notebooks 04 and 05)."""
from types import SimpleNamespace

import pytest

import pipelab as pl
from pipelab.views import compare
from pipelab.sim.timeline import Event, Timeline


# --- per-chunk cost scaling ---------------------------------------------------------------------

def test_chunk_costs_divide_a_rank_among_its_chunks():
    sched = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    c = compare.chunk_costs(pl.Costs(F=1.0, I=3.0, W=0.5, comm=0.1), sched)
    assert (c.F, c.I, c.W, c.comm) == (0.5, 1.5, 0.25, 0.1)
    # One chunk per rank: unchanged.
    plain = compare.chunk_costs(pl.Costs(F=1.0, I=3.0, W=0.5), pl.schedule("1f1b", ranks=2, microbatches=4))
    assert (plain.F, plain.I, plain.W) == (1.0, 3.0, 0.5)


def test_chunk_costs_keep_a_fixed_batch():
    """per="batch" (the whole batch's cost, shared by the microbatches) survives the scaling:
    a fixed batch takes the same work whatever m, so 1F1B's makespan is (m+p−1)/m × 3."""
    sched = pl.schedule("interleaved-1f1b", ranks=4, microbatches=8, chunks=2)
    c = compare.chunk_costs(pl.Costs(F=8.0, I=8.0, W=8.0, per="batch"), sched)
    assert c.per == "batch" and c.F == 4.0
    tl = compare.simulate_named("1f1b", 4, 8, pl.Costs(F=8.0, I=8.0, W=8.0, per="batch"))
    assert tl.makespan == pytest.approx(33)
    gain = compare.interleaving_gain(4, 8, 2, rank_costs=pl.Costs(F=8.0, I=8.0, W=8.0, per="batch"))
    assert gain["interleaved"] == pytest.approx(28.5)


def test_chunk_costs_per_rank_lists_follow_the_placement():
    """Rank costs are per rank: stage s takes its rank's cost / v (loop and V placements)."""
    loop = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)   # 0 1 0 1
    c = compare.chunk_costs(pl.Costs(F=[2.0, 4.0]), loop)
    assert c.F == [1.0, 2.0, 1.0, 2.0]
    vee = pl.schedule("zb-v", ranks=2, microbatches=3)                            # 0 1 1 0
    c = compare.chunk_costs(pl.Costs(F=[2.0, 4.0], B=[6.0, 8.0]), vee)
    assert c.F == [1.0, 2.0, 2.0, 1.0] and c.B == [3.0, 4.0, 4.0, 3.0]
    with pytest.raises(ValueError, match="one per rank"):
        compare.chunk_costs(pl.Costs(F=[1.0, 1.0, 1.0, 1.0]), loop)


def test_reference_values_for_the_same_model():
    """docs/formulas.md: p=4, m=8, unit rank costs: 1F1B 33, interleaved v=2 28.5 (peaks 5.5 / 2.5),
    ZB-H1 27, ZB-H2 span 24 / wall-clock 27."""
    assert compare.simulate_named("1f1b", 4, 8).makespan == 33
    inter = compare.simulate_named("interleaved-1f1b", 4, 8, chunks=2)
    assert inter.makespan == pytest.approx(28.5)
    assert inter.peak_activations()[0] == pytest.approx(5.5)
    assert inter.peak_activations()[3] == pytest.approx(2.5)
    assert compare.simulate_named("zb-h1", 4, 8).makespan == 27
    h2 = compare.simulate_named("zb-h2", 4, 8)
    assert compare.longest_span(h2) == 24 and h2.makespan == 27


def test_spans_are_first_start_to_last_end_per_rank():
    a = pl.Action(0, "F", 0)
    tl = Timeline([Event(0, a, 1.0, 2.0), Event(0, a, 5.0, 7.0), Event(1, a, 3.0, 4.0)], ranks=3)
    assert compare.spans(tl) == {0: 6.0, 1: 1.0, 2: 0.0}
    assert compare.longest_span(tl) == 6.0


# --- interleaving and communication --------------------------------------------------------------

def test_messages_grow_with_the_number_of_stages():
    """Every stage boundary is crossed by an activation and a gradient per microbatch:
    2m(pv − 1) messages."""
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 6, 3)]:
        inter = pl.schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v)
        assert compare.messages(inter) == 2 * m * (p * v - 1)
    assert compare.messages(pl.schedule("1f1b", ranks=4, microbatches=8)) == 2 * 8 * 3


def test_interleaving_gain_without_communication_is_the_bubble_over_v():
    for v in (2, 3, 4):
        gain = compare.interleaving_gain(4, 8, v)
        assert gain["1f1b"] == 33
        assert gain["saving"] == pytest.approx(3 * 3 * (1 - 1 / v))    # (p−1)(F+B)(1 − 1/v)


def test_crossover_is_where_the_makespans_meet():
    for v in (2, 3, 4):
        c = compare.crossover_comm(4, 8, v)
        assert c is not None and 0 < c < 4
        assert compare.interleaving_gain(4, 8, v, c - 1e-3)["saving"] > 0
        assert compare.interleaving_gain(4, 8, v, c + 1e-3)["saving"] <= 0
    # More chunks: more messages, so communication eats the gain sooner.
    assert compare.crossover_comm(4, 8, 4) < compare.crossover_comm(4, 8, 2)


def test_crossover_none_when_interleaving_always_wins_below_the_bound():
    assert compare.crossover_comm(4, 8, 2, upper=0.5) is None


def test_comm_sweep_is_a_table_of_gains():
    rows = compare.comm_sweep(4, 8, chunks=[2, 4], comms=[0.0, 0.5])
    assert [(r["chunks"], r["comm"]) for r in rows] == [(2, 0.0), (2, 0.5), (4, 0.0), (4, 0.5)]
    assert rows[0]["saving"] == pytest.approx(4.5)
    assert rows[3]["saving"] < 0       # v=4 at c=0.5 is past its crossover (0.375)


# --- every schedule, bubble against memory -------------------------------------------------------

def test_schedule_table_rows():
    rows = {r["name"]: r for r in compare.schedule_table(4, 8)}
    assert set(rows) == set(pl.SCHEDULES)
    assert rows["gpipe"]["peak"] == 8 and rows["1f1b"]["peak"] == 4
    assert rows["interleaved-1f1b"]["chunks"] == 2 and rows["interleaved-1f1b"]["peak"] == 5.5
    assert rows["looped-bfs"]["peak"] == 8
    assert rows["zb-h2"]["peak"] == 7 and rows["zb-h2"]["span"] == 24 and rows["zb-h2"]["makespan"] == 27
    assert rows["zb-v"]["peak"] == 4 and rows["zb-v"]["span"] == 24
    assert rows["1f1b"]["bubble"] == pytest.approx(3 / 11)
    assert rows["zb-h1"]["bubble"] == pytest.approx(3 / 27)
    assert rows["gpipe"]["peaks"] == [8] * 4 and rows["1f1b"]["peaks"] == [4, 3, 2, 1]
    assert rows["zb-h2"]["peak_first"] == rows["zb-h2"]["peaks"][0]


def test_schedule_table_makespan_per_unit_of_latency():
    unit = pl.Costs(F=1.0, I=1.0, W=1.0)
    rows = {r["name"]: r for r in compare.schedule_table(4, 8, unit, names=["gpipe", "1f1b"])}
    # GPipe pays the latency once down and once up; 1F1B once per crossing of its path (2m)
    assert rows["gpipe"]["per_latency"] == 2 * (4 - 1) and rows["1f1b"]["per_latency"] == 16
    one_f = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), pl.Costs(comm=0.5))
    assert rows["1f1b"]["per_latency"] == one_f.path_summary().crossings
    # measured from the given latency, not from zero: the table's other numbers keep it
    slow = {r["name"]: r for r in compare.schedule_table(
        4, 8, pl.Costs(comm=0.5), names=["gpipe", "1f1b"])}
    assert slow["1f1b"]["makespan"] == 41 and slow["gpipe"]["makespan"] == 36
    assert slow["gpipe"]["per_latency"] == 6 and slow["1f1b"]["per_latency"] == 16
    text = compare.format_table(list(rows.values()), per_rank=True)
    assert "per c" in text and "4 3 2 1" in text and "8 8 8 8" in text
    assert "peak per rank" not in compare.format_table(list(rows.values()))


def test_schedule_table_keeps_a_row_for_a_refused_schedule():
    rows = {r["name"]: r for r in compare.schedule_table(4, 4, names=["1f1b", "zb-h2"])}
    assert rows["1f1b"]["error"] is None
    assert "2*ranks - 1" in rows["zb-h2"]["error"] and "makespan" not in rows["zb-h2"]
    assert "refused" in compare.format_table(list(rows.values()))


def test_plot_schedule_table_draws_one_dot_per_schedule():
    import matplotlib
    matplotlib.use("Agg")
    rows = compare.schedule_table(4, 8, names=["1f1b", "zb-h1", "zb-h2"])
    ax = compare.plot_schedule_table(rows)
    assert len(ax.lines) == 3
    assert sorted(t.get_text() for t in ax.texts) == ["1f1b", "zb-h1", "zb-h2"]
    assert "simulated" in ax.get_title()


def test_plot_schedule_table_gives_each_schedule_its_colour_and_a_readable_label():
    import matplotlib
    matplotlib.use("Agg")
    names = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v"]
    rows = compare.schedule_table(4, 8, names=names)
    twin = dict(rows[1], name="1f1b copy")              # a second schedule on 1F1B's very point
    ax = compare.plot_schedule_table(rows + [twin])
    colours = [tuple(line.get_color()) for line in ax.lines]
    assert len(set(colours)) == len(names) + 1          # one colour per schedule
    labels = {t.get_text(): t for t in ax.texts}
    assert [tuple(labels[n].get_color()) for n in names + ["1f1b copy"]] == colours  # label = dot
    # the two names on one point are drawn on separate lines, not on top of each other
    assert labels["1f1b"].xyann != labels["1f1b copy"].xyann


# --- predicted vs measured gain ------------------------------------------------------------------

def _fake_run(name: str, costs: pl.Costs, comm: float, jitter: float = 0.0):
    """A RunResult-like object whose measured timeline is the simulation with CPU times."""
    sched = pl.schedule(name, ranks=2, microbatches=4)
    tl = pl.simulate(sched, costs)
    events = [Event(e.rank, e.action, e.start, e.end * (1 + jitter), e.duration) for e in tl.events]
    measured = Timeline(events, 2, source="measured", time_unit="s")
    return SimpleNamespace(schedule=sched, timeline=measured, replay=tl, comm_latency=comm)


def test_fit_costs_takes_b_from_full_backwards_and_i_w_from_split_ones():
    truth = pl.Costs(F=0.010, I=0.012, W=0.006, B=0.020, unit="s")   # B ≠ I + W on purpose
    base = _fake_run("1f1b", truth, 1e-4)
    zb = _fake_run("zb-h1", truth, 3e-4)
    fitted = compare.fit_costs(base, zb)
    assert fitted.F == pytest.approx([0.010, 0.010])
    assert fitted.B == pytest.approx([0.020, 0.020])
    assert fitted.I == pytest.approx([0.012, 0.012]) and fitted.W == pytest.approx([0.006, 0.006])
    assert fitted.comm == pytest.approx(2e-4)      # the median of two latencies: their mean


def test_gain_check_predicts_the_saving_of_its_own_model():
    truth = pl.Costs(F=0.010, I=0.010, W=0.010, unit="s")
    base, zb = _fake_run("1f1b", truth, 0.0), _fake_run("zb-h1", truth, 0.0)
    check = compare.gain_check(base, zb)
    # p=2: 1F1B (m+p−1)(F+B) = 15F, ZB-H1 3mF + (p−1)(F+I−W) = 13F.
    assert check.predicted == pytest.approx({"base": 0.150, "new": 0.130})
    assert check.predicted_saving == pytest.approx(0.020)
    assert check.replayed_saving == pytest.approx(0.020) and check.error("replayed") < 1e-9
    assert "saving" in check.table("1f1b", "zb-h1")


def test_gain_check_uses_median_runs_and_reports_the_error():
    truth = pl.Costs(F=0.010, I=0.010, W=0.010, unit="s")
    bases = [_fake_run("1f1b", truth, 0.0, j) for j in (0.0, 0.5, 0.1)]
    zbs = [_fake_run("zb-h1", truth, 0.0, j) for j in (0.0, 0.0, 0.0)]
    check = compare.gain_check(bases, zbs)
    # measured makespans of the bases: 0.150, 0.225, 0.165 -> median 0.165.
    assert check.measured["base"] == pytest.approx(0.165)
    # per-round savings 0.020, 0.095, 0.035 -> median 0.035
    assert check.measured_saving == pytest.approx(0.035)
    assert check.error("measured") == pytest.approx(0.75)


def test_gain_check_pairs_the_rounds():
    """Savings are per-round differences: a slow spell is compared within its round."""
    truth = pl.Costs(F=0.010, I=0.010, W=0.010, unit="s")
    bases = [_fake_run("1f1b", truth, 0.0, j) for j in (0.0, 0.0, 1.0)]   # 0.150 0.150 0.300
    zbs = [_fake_run("zb-h1", truth, 0.0, j) for j in (0.0, 1.0, 1.0)]    # 0.130 0.260 0.260
    check = compare.gain_check(bases, zbs)
    # Per round: 0.020, -0.110, 0.040 -> 0.020; the difference of the medians would be -0.110.
    assert check.measured_saving == pytest.approx(0.020)
    assert check.measured == pytest.approx({"base": 0.150, "new": 0.260})
    assert check.share("measured") == pytest.approx(0.020 / 0.150)
    assert check.share("predicted") == pytest.approx(0.020 / 0.150)
    # Unequal numbers of runs cannot be paired: the medians' difference.
    check = compare.gain_check(bases, zbs[:2])
    assert check.measured_saving == pytest.approx(0.150 - 0.195)


def test_fit_costs_refuses_runs_of_different_splits():
    truth = pl.Costs(unit="s")
    a = _fake_run("1f1b", truth, 0.0)
    b = _fake_run("1f1b", truth, 0.0)
    b.schedule = pl.schedule("interleaved-1f1b", ranks=2, microbatches=4, chunks=2)
    with pytest.raises(ValueError, match="split the model differently"):
        compare.fit_costs(a, b)


def test_gain_check_predicts_each_round_from_its_own_costs():
    """Round 2 ran on a machine twice as slow (every CPU time doubled): its prediction doubles
    with it, so the predicted saving follows the replayed one round by round."""
    fast = pl.Costs(F=0.010, I=0.010, W=0.010, unit="s")
    slow = pl.Costs(F=0.020, I=0.020, W=0.020, unit="s")
    bases = [_fake_run("1f1b", c, 0.0) for c in (fast, slow, slow)]
    zbs = [_fake_run("zb-h1", c, 0.0) for c in (fast, slow, slow)]
    check = compare.gain_check(bases, zbs)
    assert check.predicted_saving == pytest.approx(0.040)       # per round: 0.020, 0.040, 0.040
    assert check.predicted == pytest.approx({"base": 0.300, "new": 0.260})
    assert check.error("replayed") == pytest.approx(0.0, abs=1e-9)
    # The table fitted on all six runs is the medians': a mixture of fast and slow.
    assert check.costs.F == pytest.approx([0.020, 0.020])


def test_pl_compare_is_imported_without_loading_the_drawing_libraries():
    import subprocess
    import sys
    code = ("import sys, pipelab as pl; assert pl.compare.schedule_table; "
            "print(sorted(m for m in ('ipywidgets', 'matplotlib', 'IPython') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_gpipe_makespan_is_the_simulated_one_for_unbalanced_stages():
    cfg = pl.ModelConfig(n_layers=8, d_model=64, n_heads=4, vocab_size=2048, seq_len=32)
    for method in ("uniform", "cost"):
        part = pl.partition(cfg, 4, method, batch_size=8)
        costs = part.costs()                      # MFLOP; B = 2F split as I = W = F
        assert costs.unit == "MFLOP" and costs.F == [f / 1e6 for f in part.flops]
        assert costs.I == costs.W == costs.F
        tl = pl.simulate(pl.schedule("gpipe", ranks=4, microbatches=8), costs)
        closed = compare.gpipe_makespan([3 * f / 1e6 for f in part.flops], 8)
        assert tl.makespan == pytest.approx(closed, rel=1e-12)
    assert compare.gpipe_makespan([1.0, 3.0, 2.0], 4) == 6 + 3 * 3
    assert compare.gpipe_makespan([3.0] * 4, 8) == 33          # (m + p − 1)(F + B)
    half = pl.partition(cfg, 2, "uniform").costs(backward_ratio=3.0, per_unit=1, unit="FLOP")
    assert half.I[0] == half.W[0] == 1.5 * half.F[0]
    with pytest.raises(ValueError):
        compare.gpipe_makespan([], 4)


def test_latency_sweep_rows():
    rows = compare.latency_sweep(4, 8, [0.0, 0.5, 1.0])
    assert [r["c"] for r in rows] == [0.0, 0.5, 1.0]
    assert [(r["gpipe"], r["1f1b"]) for r in rows] == [(33, 33), (36, 41), (39, 49)]
    big = compare.latency_sweep(6, 16, [0.5], backward_ratio=3.0, names=["gpipe", "1f1b"])
    assert (big[0]["gpipe"], big[0]["1f1b"]) == (89, 101)
    assert set(compare.latency_sweep(2, 2, [0.0], names=["zb-h1"])[0]) == {"c", "zb-h1"}


def test_format_table_cuts_a_long_refusal_between_words():
    words = "needs microbatches that are a multiple of the ranks times the chunks per rank here"
    row = {"name": "x", "chunks": 2, "error": "interleaved-1f1b " + words}
    shown = compare.format_table([row]).splitlines()[1].split("(refused: ")[1].rstrip(")")
    assert shown.endswith(" …") and len(shown) <= compare.REFUSAL_CUT
    assert row["error"].startswith(shown[:-2]) and row["error"][len(shown) - 2] == " "
    short = {"name": "y", "chunks": 1, "error": "needs m >= p"}
    assert "(refused: needs m >= p)" in compare.format_table([short])


def test_explorers_draw_in_the_kernel_and_wrap_refusals(monkeypatch):
    """The 04/05 explorers (one `ui.slider_box`) render kernel-side (`with out:` can hang a
    headless executor, so any use fails here) and print a refusal wrapped between words."""
    import ipywidgets as w
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pipelab.views import ui

    def captured(*_):
        raise AssertionError("output routed through the Output widget")
    monkeypatch.setattr(w.Output, "__enter__", captured)
    inter = compare.interleaving_explorer(ranks=4, microbatches=8, chunks=2)
    inter.controls["microbatches"].value = 12
    assert ui.text_of(inter.out).startswith("simulated makespan: 1F1B ")
    box = compare.zero_bubble_explorer(ranks=4, microbatches=8)
    box.controls["name"].value = "zb-h2"
    assert ui.text_of(box.out).startswith("simulated: zb-h2 makespan")
    box.controls["microbatches"].value = 4      # zb-h2 needs m >= 2p - 1 = 7: refused
    for b in (inter, box):
        assert not [o for o in b.out.outputs if o["output_type"] == "error"]
    text = ui.text_of(box.out)
    assert text.startswith("refused: zb-h2 needs microbatches >= 2*ranks - 1 = 7")
    lines = text.splitlines()                   # a 200-character message, wrapped
    assert len(lines) > 1 and max(len(line) for line in lines) <= pl.explorer.REFUSAL_WIDTH
    assert " ".join(line.strip() for line in lines) == \
        "refused: " + " ".join(str(compare_error(4)).split())
    plt.close("all")


def compare_error(microbatches: int) -> str:
    with pytest.raises(ValueError) as info:
        compare.simulate_named("zb-h2", 4, microbatches, pl.Costs())
    return str(info.value)
