"""The simulator against the closed forms of the papers (GPipe §2.3, Megatron SC21 §2.2.1),
collected with their sources in docs/formulas.md."""
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
        assert tl.busy() == {r: 3 * m for r in range(p)}, (p, m)  # docs/formulas.md: busy 3m


def test_peak_activations_gpipe_holds_m_and_1f1b_holds_min_p_minus_i_m():
    for p, m in GRID:
        gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), UNIT).peak_activations()
        assert gpipe == {i: m for i in range(p)}, (p, m)
        one_f = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), UNIT).peak_activations()
        assert one_f == {i: min(p - i, m) for i in range(p)}, (p, m)


@pytest.mark.parametrize("comm", [0.1, 0.5, 2.0])
def test_gpipe_communication_adds_two_p_minus_one_hops(comm):
    for p, m in [(2, 4), (4, 8), (8, 3)]:
        costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=comm)
        with_comm = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), costs).makespan
        assert with_comm == pytest.approx(3 * (m + p - 1) + 2 * (p - 1) * comm)


def test_one_f_one_b_exposes_communication_in_its_steady_state():
    # Worked by hand (F=1, B=2, c=0.5). p=2, m=2 hides it: 0F0 [0,1] 0F1 [1,2] | 1F0 [1.5,2.5]
    # 1B0 [2.5,4.5] | 0B0 [5,7] | 1F1 [4.5,5.5] 1B1 [5.5,7.5] | 0B1 [8,10]: 10, GPipe's 9 + 2c.
    costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=0.5)
    assert pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=2), costs).makespan == 10.0
    # p=4, m=8 does not: steady-state backwards wait for a gradient round trip, so 1F1B takes
    # 41 where GPipe takes 33 + 6c = 36 (41 from reference_simulation below, a second method).
    one_f = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), costs)
    assert one_f.makespan == 41.0


def test_stages_on_one_rank_hand_over_without_communication():
    # Worked by hand (F=1, B=2, c=0.5): only 1F0->2F0 and 2B0->1B0 cross ranks, so the
    # makespan is 4 stages x 3 + 2c = 13; paying c on the four same-rank edges would give 15.
    sched = pl.Schedule.from_text("0F0 1F0 1B0 0B0\n2F0 3F0 3B0 2B0", placement=[0, 0, 1, 1])
    tl = pl.simulate(sched, pl.Costs.per_stage(F=1.0, I=1.0, W=1.0, comm=0.5))   # per stage
    assert tl.makespan == 13.0
    assert {str(e.action): (e.start, e.end) for e in tl.events} == {
        "0F0": (0, 1), "1F0": (1, 2), "2F0": (2.5, 3.5), "3F0": (3.5, 4.5), "3B0": (4.5, 6.5),
        "2B0": (6.5, 8.5), "1B0": (9, 11), "0B0": (11, 13)}


# --- a second simulator, written from the rules in docs/formulas.md rather than from kinds.py --

def reference_simulation(sched, F, I, W, comm, i_frees):
    """Start and end of every action and each rank's activation curve, by relaxation to a
    fixed point (longest path), with the dependency rules written out by hand: F(s) needs
    F(s-1); B or I of s needs F(s) and the input gradient (B or I) of s+1; W needs I; comm
    is paid on cross-rank edges only.
    Memory: F adds 1/v at its start, B frees 1/v, I i_frees/v and W the rest at their end;
    changes at one instant are merged into one step of the curve."""
    place, last = sched.placement, sched.stages - 1
    ran = {a for acts in sched.actions for a in acts}
    cost = {"F": F, "I": I, "W": W, "B": [i + w for i, w in zip(I, W)]}

    def grad(s, mb):
        return (s, "B", mb) if (s, "B", mb) in ran else (s, "I", mb)

    def deps(a):
        s, kind, mb = a
        if kind == "F":
            return [(s - 1, "F", mb)] if s > 0 else []
        if kind == "W":
            return [(s, "I", mb)]
        return [(s, "F", mb)] + ([grad(s + 1, mb)] if s < last else [])

    end = {tuple(a): 0.0 for a in ran}
    start = dict(end)
    for _ in range(len(ran) + 1):
        changed = False
        for acts in sched.actions:
            free = 0.0
            for a in map(tuple, acts):
                begin = max([free] + [end[d] + (comm if place[d[0]] != place[a[0]] else 0.0)
                                      for d in deps(a)])
                if begin != start[a] or begin + cost[a[1]][a[0]] != end[a]:
                    start[a], end[a], changed = begin, begin + cost[a[1]][a[0]], True
                free = end[a]
        if not changed:
            break
    curves = {}
    for rank, acts in enumerate(sched.actions):
        v = len(sched.stages_of(rank))
        frees = {"F": 0.0, "B": 1.0, "I": i_frees, "W": 1.0 - i_frees}
        changes = {0.0: 0.0}
        for a in map(tuple, acts):
            t, delta = (start[a], 1 / v) if a[1] == "F" else (end[a], -frees[a[1]] / v)
            changes[t] = changes.get(t, 0.0) + delta
        level, curves[rank] = 0.0, []
        for t in sorted(changes):
            level += changes[t]
            curves[rank].append((t, level))
    return start, end, curves


SECOND_METHOD = [("gpipe", {}), ("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}),
                 ("looped-bfs", {"chunks": 2}), ("zb-h1", {}), ("zb-h2", {}), ("zb-v", {})]


@pytest.mark.parametrize("comm", [0.0, 0.3])
@pytest.mark.parametrize("name,options", SECOND_METHOD)
def test_simulator_agrees_with_a_second_method(name, options, comm):
    for p, m in [(2, 4), (3, 6), (4, 8)]:
        sched = pl.schedule(name, ranks=p, microbatches=m, **options)
        stages = sched.stages
        F = [1.0 + 0.25 * (s % 3) for s in range(stages)]          # unbalanced on purpose
        I = [1.5 - 0.5 * (s % 2) for s in range(stages)]
        W = [0.5 + 0.25 * (s % 2) for s in range(stages)]
        tl = pl.simulate(sched, pl.Costs.per_stage(F=F, I=I, W=W, comm=comm), i_frees=0.25)
        start, end, curves = reference_simulation(sched, F, I, W, comm, 0.25)
        got = {(tuple(e.action), edge): t for e in tl.events
               for edge, t in (("start", e.start), ("end", e.end))}
        want = {(a, edge): t[a] for a in start for edge, t in (("start", start), ("end", end))}
        assert got == pytest.approx(want), (p, m)
        assert tl.makespan == pytest.approx(max(end.values())), (p, m)
        for rank, curve in curves.items():          # the whole activation curve, step by step
            assert [x for point in tl.memory_curve(rank) for x in point] == \
                pytest.approx([x for point in curve for x in point], abs=1e-9), (p, m, rank)


def test_the_second_method_agrees_with_the_hand_worked_numbers():
    unit = dict(F=[1.0] * 4, I=[1.0] * 4, W=[1.0] * 4, comm=0.5, i_frees=0.0)
    co_located = pl.Schedule.from_text("0F0 1F0 1B0 0B0\n2F0 3F0 3B0 2B0", placement=[0, 0, 1, 1])
    for sched, makespan in [(pl.schedule("1f1b", ranks=2, microbatches=2), 10.0),
                            (co_located, 13.0),
                            (pl.schedule("1f1b", ranks=4, microbatches=8), 41.0)]:
        _, end, _ = reference_simulation(sched, **unit)
        assert max(end.values()) == makespan


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
    with pytest.raises(ValueError, match="Costs.F has 2 values.*one per rank \\(3\\)"):
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
    boxes = {e["name"]: e for e in trace if e["ph"] == "X"}
    assert len(boxes) == 3 * 4 * 2
    # One cost unit is one second of trace: 2F0 runs [2, 3] on rank 2, then 2B0 [3, 5].
    assert [(boxes[a]["tid"], boxes[a]["ts"], boxes[a]["dur"]) for a in ("2F0", "2B0")] == \
        [(2, 2e6, 1e6), (2, 3e6, 2e6)]
    rank0 = [e["args"]["microbatch-stages"] for e in trace if e["name"] == "activations rank 0"]
    assert max(rank0) == 3 and rank0[-1] == 0          # 1F1B's p - 0, all freed at the end
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
