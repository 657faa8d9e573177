"""What the notebooks teach with: fixed-batch costs, the critical path, phases, sweep tables and
comparison figures. Every registered schedule is checked (other chapters add more)."""
from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.schedules.graph import members_of  # noqa: E402
from pipelab.schedules.kinds import comm_kinds  # noqa: E402

UNIT = pl.Costs(F=1.0, I=1.0, W=1.0)


def _build(name: str, p: int, m: int):
    """The named schedule at (p, m), or None where the generator refuses that shape."""
    try:
        return pl.schedule(name, ranks=p, microbatches=m)
    except (ValueError, pl.ScheduleError):
        return None


# --- fixed global batch ------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_fixed_batch_naive_is_slower_than_gpipe_for_every_m(p):
    batch = pl.Costs(F=1.0, I=1.0, W=1.0, per="batch")
    naive = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=1), batch).makespan
    assert naive == pytest.approx(3 * p)          # the batch's F + B once per stage, one at a time
    previous = naive
    for m in range(2, 33):
        gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), batch).makespan
        assert gpipe == pytest.approx(3 * (m + p - 1) / m), (p, m)
        assert gpipe < naive and gpipe < previous, (p, m)      # and it falls as m grows
        previous = gpipe


def test_per_microbatch_stays_the_default_and_the_title_says_which():
    sched = pl.schedule("gpipe", ranks=4, microbatches=8)
    assert pl.Costs().per == "microbatch"
    assert pl.simulate(sched, UNIT).makespan == 33
    tl = pl.simulate(sched, pl.Costs(per="batch"))
    assert "fixed batch" in tl.title and "fixed batch" not in pl.simulate(sched, UNIT).title
    # a message's latency and measured per-action times are never scaled
    with_comm = pl.simulate(sched, pl.Costs(per="batch", comm=0.5)).makespan
    assert with_comm == pytest.approx(tl.makespan + 2 * 3 * 0.5)
    measured = {a: 0.25 for acts in sched.actions for a in acts}
    assert pl.simulate(sched, pl.Costs(per="batch", per_action=measured)).makespan == \
        pl.simulate(sched, pl.Costs(per_action=measured)).makespan
    with pytest.raises(ValueError, match="Costs.per"):
        pl.Costs(per="step")


# --- the critical path -------------------------------------------------------------------------

COSTS = {
    "unit": pl.Costs(F=1.0, I=1.0, W=1.0),
    "unit+comm": pl.Costs(F=1.0, I=1.0, W=1.0, comm=0.5),
    "unequal+comm": pl.Costs.per_stage(F=[1.0, 1.5, 0.75, 2.0], I=[1.25, 1.0, 0.5, 2.5],
                                       W=[0.5, 1.0, 0.25, 1.5], comm=0.25),
    "odd": pl.Costs(F=0.3, I=0.7, W=0.45, comm=0.1),     # not exact in binary: rounding only
}


def _for(cost: pl.Costs, sched) -> pl.Costs:
    """A per-stage table cut to the schedule's stages (one too short: unequal scalars instead)."""
    if not isinstance(cost.F, list):
        return cost
    n = sched.stages
    if n > len(cost.F):
        return pl.Costs(F=1.0, I=1.25, W=0.5, comm=0.25)
    return dataclasses.replace(cost, F=cost.F[:n], I=cost.I[:n], W=cost.W[:n])


def _aside(event) -> bool:
    """On the communication lane (beside the compute)?"""
    return event.action.parts[0].kind in comm_kinds()


def _check_path(tl) -> list:
    sched = tl.schedule
    path = tl.critical_path()
    assert path, "a non-empty timeline has a critical path"
    assert path[0].edge == "start" and path[-1].event.end - tl.start == pytest.approx(tl.makespan)
    for before, step in zip(path, path[1:]):
        a, b = before.event, step.event
        if step.edge == "data":
            # (a compound step feeds b through one of its parts)
            assert set(a.action.parts) & set(sched.dependencies(b.action)), (a, b)
            assert step.comm_before == (tl.comm if tl.crosses(a, b) else 0.0)
        elif members_of(sched, b.action) if len(b.action.parts) == 1 else None:
            # a collective starts when its last member arrives: a member's previous action
            assert step.edge == "rank" and step.comm_before == 0
            assert a.rank in members_of(sched, b.action) and a.end <= b.start, (a, b)
        else:
            assert step.edge == "rank" and a.rank == b.rank and step.comm_before == 0
            mine = [e for e in tl.events_of(a.rank) if _aside(e) == _aside(b)]
            assert mine.index(b) == mine.index(a) + 1, (a, b)     # the very next on its lane
        assert b.start == pytest.approx(a.end + step.comm_before + step.wait_before)
        assert step.wait_before == pytest.approx(0.0, abs=1e-12)   # simulated: no slack on it
    return path


@pytest.mark.parametrize("name", sorted(pl.SCHEDULES))
@pytest.mark.parametrize("costs", list(COSTS), ids=list(COSTS))
def test_critical_path_is_a_dependent_chain_summing_to_the_makespan(name, costs):
    checked = 0
    for p, m in [(1, 3), (2, 4), (4, 8), (4, 4), (3, 6)]:
        sched = _build(name, p, m)
        if sched is None:
            continue
        tl = pl.simulate(sched, _for(COSTS[costs], sched))
        path = _check_path(tl)
        total = sum(s.duration + s.comm_before + s.wait_before for s in path)
        if costs == "odd":
            assert total == pytest.approx(tl.makespan, rel=1e-12)
        else:
            assert total == tl.makespan, (name, p, m)     # dyadic costs: exact
        checked += 1
    assert checked, f"{name}: no shape tried here builds; add one"


HAND_WRITTEN = {   # shapes the registry may not have yet: two chunks per rank, a split backward
    "looped": pl.Schedule.from_text("0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1\n"
                                    "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1", placement=[0, 1, 0, 1]),
    "split": pl.Schedule.from_text("0F0 0F1 0I0 0I1 0W0 0W1\n1F0 1I0 1F1 1I1 1W0 1W1"),
}


@pytest.mark.parametrize("name", list(HAND_WRITTEN))
@pytest.mark.parametrize("costs", list(COSTS)[:3], ids=list(COSTS)[:3])
def test_critical_path_with_chunks_and_split_backward(name, costs):
    tl = pl.simulate(HAND_WRITTEN[name], _for(COSTS[costs], HAND_WRITTEN[name]))
    path = _check_path(tl)
    assert sum(s.duration + s.comm_before + s.wait_before for s in path) == tl.makespan


def test_one_f_one_b_puts_latency_on_its_critical_path_once_per_round_trip():
    p, m, c = 4, 8, 0.5
    costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=c)
    gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), costs)
    one_f = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), costs)
    assert (gpipe.makespan, one_f.makespan) == (36, 41)            # the numbers
    hops = {name: sum(s.comm_before > 0 for s in tl.critical_path())
            for name, tl in (("gpipe", gpipe), ("1f1b", one_f))}
    # GPipe pays the latency once down and once up the pipeline: 2(p−1) messages.
    # 1F1B's steady state waits for a gradient, then for an activation, again and again.
    assert hops == {"gpipe": 2 * (p - 1), "1f1b": 16} and hops["1f1b"] >= m
    for tl in (gpipe, one_f):       # both paths carry the same 33 units of compute
        assert sum(s.duration for s in tl.critical_path()) == 33
        assert tl.makespan == 33 + hops[tl.schedule.name] * c


def test_path_summary_counts_crossings_whatever_the_latency():
    p, m = 4, 8
    for c in (0.0, 0.5):
        costs = pl.Costs(F=1.0, I=1.0, W=1.0, comm=c)
        one_f = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), costs)
        s = one_f.path_summary()
        assert isinstance(s, pl.timeline.PathSummary)
        assert s.actions == len(one_f.critical_path()) and s.compute == 33
        assert s.waiting == 0 and s.total == one_f.makespan
        # the path is the same chain at c = 0: rank changes counted, whether or not they cost
        assert s.crossings == 16 and s.comm == 16 * c
        assert s.messages == (16 if c else 0)
        text = pl.plots.path_summary(one_f)
        assert "16 rank crossings" in text and f"{s.comm:.4g} comm" in text
    gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), pl.Costs(comm=0.5))
    assert gpipe.path_summary().crossings == 2 * (p - 1)
    tl = pl.simulate(pl.schedule("1f1b", ranks=3, microbatches=4), pl.Costs(comm=0.25))
    bare = pl.Timeline(tl.events, tl.ranks, source="measured", memory=tl.memory, time_unit="units")
    measured = bare.path_summary()      # no comm known: latency is waiting, crossings still seen
    assert measured.comm == 0 and measured.messages == 0
    assert measured.crossings == tl.path_summary().crossings > 0
    assert measured.waiting == pytest.approx(tl.path_summary().comm)
    assert pl.Timeline([], 2).path_summary() == pl.timeline.PathSummary(0, 0, 0, 0, 0, 0)


def test_critical_path_of_a_timeline_without_schedule_uses_the_rebuilt_one():
    tl = pl.simulate(pl.schedule("1f1b", ranks=3, microbatches=4), pl.Costs(comm=0.25))
    bare = pl.Timeline(tl.events, tl.ranks, source="measured", memory=tl.memory, time_unit="units")
    assert bare.schedule is None
    rebuilt = bare.dependency_schedule()
    assert rebuilt.actions == tl.schedule.actions and rebuilt.placement == tl.schedule.placement
    path = bare.critical_path()        # no comm known: the latency shows up as waiting
    assert [s.event for s in path] == [s.event for s in tl.critical_path()]
    assert sum(s.wait_before for s in path) == pytest.approx(
        sum(s.comm_before for s in tl.critical_path()))


def test_phases_of_gpipe_and_1f1b():
    gpipe = pl.simulate(pl.schedule("gpipe", ranks=4, microbatches=8), UNIT).phases()
    assert [name for name, _, _ in gpipe[0]] == ["warm-up", "cool-down"]   # no steady state
    assert gpipe[0] == [("warm-up", 0.0, 17.0), ("cool-down", 17.0, 33.0)]
    one_f = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), UNIT).phases()
    for rank, spans in one_f.items():
        assert [n for n, _, _ in spans] == ["warm-up", "steady", "cool-down"], rank
        assert all(a < b for _, a, b in spans)
        assert all(spans[i][2] == spans[i + 1][1] for i in range(2))      # they tile the rank
    assert one_f[3][0] == ("warm-up", 3.0, 4.0)         # the last rank warms up with one forward


# --- data before drawing -----------------------------------------------------------------------

def test_sweep_table_is_what_plot_sweep_draws():
    table = pl.plots.sweep("gpipe", ranks=[2, 4], microbatches=range(1, 9),
                           metric=lambda t: t.bubble_fraction(),
                           formula=lambda p, m: (p - 1) / (m + p - 1))
    assert len(table) == 16 and table.ranks() == [2, 4]
    assert {"p", "m", "simulated", "formula"} <= set(table[0])
    assert table.max_error() < 1e-12
    ax = pl.plots.plot_sweep(table, ylabel="bubble")
    dots = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    assert [list(d.get_ydata()) for d in dots] == [[r["simulated"] for r in table.where(p)]
                                                   for p in (2, 4)]
    # the older call still works
    ax = pl.plots.plot_sweep("1f1b", ranks=[2], microbatches=[1, 2], metric=lambda t: t.makespan,
                             ylabel="makespan")
    assert list(ax.get_lines()[0].get_ydata()) == [6.0, 9.0]
    fixed = pl.plots.sweep("gpipe", [4], [1, 2, 4], lambda t: t.makespan, costs=pl.Costs(per="batch"))
    assert [r["simulated"] for r in fixed] == [12.0, 7.5, 5.25] and fixed[0]["formula"] is None
    plt.close("all")


def test_compare_shares_time_axis_and_memory_scale():
    p, m = 4, 8
    gpipe = pl.simulate(pl.schedule("gpipe", ranks=p, microbatches=m), pl.Costs(comm=0.5))
    one_f = pl.simulate(pl.schedule("1f1b", ranks=p, microbatches=m), pl.Costs(comm=0.5))
    fig = pl.plots.compare([gpipe, one_f], titles=["GPipe", "1F1B"], memory=True,
                           unit_bytes=4.5 * 2**20, critical_path=True)
    axes = fig.axes
    assert len(axes) == 4                      # Gantt, memory, Gantt, memory
    assert len({ax.get_xlim() for ax in axes}) == 1 and axes[0].get_xlim()[1] == 41
    assert axes[1].get_ylim() == axes[3].get_ylim()          # GPipe's 8 and 1F1B's 4 compare
    lefts = {round(ax.get_position().x0, 6) for ax in axes}
    rights = {round(ax.get_position().x1, 6) for ax in axes}
    assert len(lefts) == len(rights) == 1                    # panels line up
    legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert legend[0] == "rank 0 peak 8 units\n= 36 MiB"
    assert "16 rank crossings" in axes[2].get_title()
    plt.close("all")
    only_memory = pl.plots.compare([gpipe, one_f], memory=True, gantt=False)
    assert len(only_memory.axes) == 2 and "memory" in only_memory.axes[0].get_title()
    seconds = pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=2), pl.Costs(unit="s"))
    fig = pl.plots.compare([gpipe, seconds])                 # different units: own axes
    assert fig.axes[0].get_xlim() != fig.axes[1].get_xlim()
    plt.close("all")


def test_gantt_tells_chunks_and_new_kinds_apart():
    sched = pl.Schedule.from_text("0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1\n"
                                  "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1", placement=[0, 1, 0, 1])
    tl = pl.simulate(sched)
    ax = tl.plot()
    hatches = {e.action.stage: bar.get_hatch() for e, bar in ax.pipelab_bars.items()}
    assert not hatches[0] and not hatches[1] and hatches[2] and hatches[3]
    assert hatches[2] == hatches[3]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "chunk 0" in labels and "chunk 1" in labels
    split = pl.simulate(pl.Schedule.from_text("0F0 0I0 0W0"))
    colours = {e.action.kind: bar.get_facecolor() for e, bar in split.plot().pipelab_bars.items()}
    assert len(set(colours.values())) == 3                  # F, I and W all differ
    assert pl.plots.kind_colour("X") == pl.plots.OTHER_COLOUR
    plt.close("all")


def test_a_chart_names_its_source_once():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tl = pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=2))
    assert tl.plot(title="1F1B").get_title().startswith("1F1B — simulated: makespan")
    titled = tl.plot(title="1F1B, simulated").get_title()
    assert titled.startswith("1F1B, simulated: makespan") and titled.count("simulated") == 1
    plt.close("all")
