"""The simulator against the closed forms of the papers (GPipe §2.3, Megatron SC21 §2.2.1),
collected with their sources in the project workspace's shared/FORMULAS.md."""
import json

import pytest

import pipelab as pl

UNIT = pl.Costs(F=1.0, I=1.0, W=1.0)          # full backward B = 2
GRID = [(p, m) for p in range(1, 9) for m in range(1, 33)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_makespan_and_both_bubble_conventions(name):
    for p, m in GRID:
        tl = pl.simulate(pl.schedule(name, ranks=p, microbatches=m), UNIT)
        assert tl.makespan == pytest.approx(3 * (m + p - 1)), (p, m)
        assert tl.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1)), (p, m)
        assert tl.bubble_ratio() == pytest.approx((p - 1) / m), (p, m)
        r = tl.bubble_ratio()
        assert tl.bubble_fraction() == pytest.approx(r / (1 + r))


@pytest.mark.parametrize("p,m,makespan", [(4, 4, 21), (4, 8, 33), (8, 16, 69), (8, 32, 117)])
def test_reference_table(p, m, makespan):
    for name in ("gpipe", "1f1b"):
        assert pl.simulate(pl.schedule(name, ranks=p, microbatches=m), UNIT).makespan == makespan


def test_peak_activations_gpipe_holds_m_and_1f1b_holds_min_p_minus_i_m():
    for p, m in GRID:
        gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), UNIT).peak_activations()
        assert gpipe == {i: m for i in range(p)}, (p, m)
        one_f = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), UNIT).peak_activations()
        assert one_f == {i: min(p - i, m) for i in range(p)}, (p, m)


@pytest.mark.parametrize("comm", [0.1, 0.5, 2.0])
def test_gpipe_communication_adds_two_p_minus_one_hops(comm):
    for p, m in [(2, 4), (4, 8), (8, 3)]:
        base = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), UNIT).makespan
        costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=comm)
        with_comm = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), costs).makespan
        assert with_comm == pytest.approx(base + 2 * (p - 1) * comm)


def test_one_f_one_b_exposes_communication_in_its_steady_state():
    sched = pl.schedule("1f1b", ranks=4, microbatches=8)
    costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=0.5)
    gpipe = pl.simulate(pl.schedule("gpipe", ranks=4, microbatches=8), costs).makespan
    assert pl.simulate(sched, costs).makespan > gpipe   # the closed form would say equal


def test_gpipe_unbalanced_stages():
    # Slowest forward and backward on the same stage (the vocabulary-layer imbalance).
    forward = [1.0, 1.5, 1.0, 3.0]
    half_b = [1.0, 1.0, 0.5, 2.5]
    costs = pl.Costs(F=forward, I=half_b, W=half_b)
    per_stage = [f + 2 * h for f, h in zip(forward, half_b)]
    for m in (1, 4, 9):
        tl = pl.simulate(pl.schedule("gpipe", ranks=4, microbatches=m), costs)
        assert tl.makespan == pytest.approx(sum(per_stage) + (m - 1) * max(per_stage))


def test_split_backward_frees_memory_by_share():
    sched = pl.Schedule.from_text("0F0 0F1 0I0 0W0 0I1 0W1")
    assert pl.simulate(sched, i_frees=0.0).peak_activations() == {0: 2}
    curve = [level for _, level in pl.simulate(sched, i_frees=0.5).memory_curve(0)]
    assert curve == [1, 2, 1.5, 1.0, 0.5, 0.0]     # 0F0 allocates at time 0


def test_per_action_costs_override_the_model():
    sched = pl.schedule("gpipe", ranks=1, microbatches=2)
    measured = {a: 0.25 for a in sched.actions[0]}
    tl = pl.simulate(sched, pl.Costs(per_action=measured, unit="s"), source="replayed")
    assert tl.makespan == pytest.approx(1.0) and tl.source == "replayed"


def test_bad_costs_raise():
    for bad in (dict(F=-1), dict(F=float("nan")), dict(I="1"), dict(W=[1, -1]),
                dict(comm=float("inf"))):
        with pytest.raises(ValueError, match=f"Costs.{next(iter(bad))}"):
            pl.Costs(**bad)
    numpy = pytest.importorskip("numpy")      # any sequence works per stage, stored as a list
    assert pl.Costs(F=numpy.array([1.0, 2.0]), I=(1, 1)).F == [1.0, 2.0]
    with pytest.raises(ValueError, match="per-stage values"):
        pl.simulate(pl.schedule("gpipe", ranks=3, microbatches=2), pl.Costs(F=[1, 1]))
    with pytest.raises(ValueError, match="costs must be a pl.Costs"):
        pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=2), 3)
    with pytest.raises(ValueError, match="i_frees"):
        pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=2), i_frees=2)


def test_chrome_trace_and_plots(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    tl = pl.simulate(pl.schedule("1f1b", ranks=3, microbatches=4))
    trace = json.loads(tl.to_chrome_trace(tmp_path / "t.json").read_text())["traceEvents"]
    boxes = [e for e in trace if e["ph"] == "X"]
    assert len(boxes) == 3 * 4 * 2 and {e["tid"] for e in boxes} == {0, 1, 2}
    ax = tl.plot()
    assert "simulated" in ax.get_title() and len(ax.patches) == 24
    assert "simulated" in tl.plot_memory().get_title()
    fig = pl.plots.compare([tl, tl], titles=["a", "b"])
    assert len(fig.axes) == 2


def test_simulate_revalidates_a_schedule_changed_after_it_was_checked():
    sched = pl.schedule("1f1b", ranks=2, microbatches=2)
    pl.simulate(sched)
    sched.actions[1].reverse()        # now 1B1 comes before its forward
    with pytest.raises(pl.ScheduleError):
        pl.simulate(sched)


def test_fit_recovers_the_cost_model_of_a_timeline():
    costs = pl.Costs(F=[1.0, 2.0], I=[1.5, 0.5], W=[1.5, 0.5], comm=0.0)
    tl = pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=4), costs)
    fitted = pl.Costs.fit(tl, stages=2)
    assert fitted.F == [1.0, 2.0] and fitted.I == [1.5, 0.5] and fitted.W == [1.5, 0.5]
    again = pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=4), fitted)
    assert again.makespan == tl.makespan


def test_a_generated_schedule_is_validated_once(monkeypatch):
    import sys
    checks = sys.modules["pipelab.schedules.validate"]      # the module; the package exports its function
    sched = pl.schedule("1f1b", ranks=4, microbatches=8)      # validates
    monkeypatch.setattr(checks, "validate", lambda s: pytest.fail("validated again"))
    sched.validate()
    pl.simulate(sched)
