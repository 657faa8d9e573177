"""A torch pipelining run read back from torch.profiler Chrome traces: `Timeline.from_torch_trace`.

The traces are recorded here, from CPU runs of torch's own runtime in pipelab's workers
(`cluster.run(..., engine="torch", torch_trace=DIR)`: torch.profiler around the last step of
each rank, exported as DIR/rank<r>.json), plus small hand-written traces for the edge cases."""
import json
import os

import pytest

import pipelab as pl
from pipelab.planner.calibrate import calibrate
from pipelab.support.noise import load_average, load_line

torch = pytest.importorskip("torch")

# Compute large enough that the profiler's own cost per operator (measured: +5% of a stage's
# thread CPU at this width, +18% at d_model 128) stays well inside the 20% tolerance.
CFG = pl.ModelConfig(n_layers=4, d_model=256, n_heads=4, seq_len=64)
ROWS = 4                    # sequences per microbatch
RUNS = {"1f1b": 8, "zb-h1": 8, "dualpipe-v": 4}      # schedule: microbatches (2 ranks)


@pytest.fixture(scope="module")
def recorded(clusters, tmp_path_factory):
    """{name: (schedule, trace folder, RunResult)}, each traced on torch's runtime (2 steps,
    the last one traced: the first one pays torch's shape inference)."""
    cluster = clusters(2)
    out = {}
    for name, m in RUNS.items():
        sched = pl.schedule(name, ranks=2, microbatches=m)
        folder = tmp_path_factory.mktemp(name)
        res = cluster.run(sched, model=CFG, engine="torch", torch_trace=str(folder), steps=2,
                          batch_size=ROWS * m, progress=False)
        out[name] = (sched, folder, res)
    return out


@pytest.mark.parametrize("name", sorted(RUNS))
def test_events_are_the_schedules_actions_in_its_order(recorded, name):
    sched, folder, res = recorded[name]
    assert res.max_grad_error <= 1e-5           # the run traced was torch's, and exact
    timeline = pl.Timeline.from_torch_trace(folder, schedule=sched)
    assert timeline.source == "measured" and timeline.ranks == 2
    assert "measured" in timeline.title
    assert len(timeline.events) == len(sched)
    for rank in range(2):
        events = timeline.events_of(rank)
        assert [e.action for e in events] == sched.actions[rank]
        for before, after in zip(events, events[1:]):       # one action at a time per rank
            assert before.start < before.end <= after.start
    busy, idle = timeline.busy(), timeline.idle()
    for rank in range(2):
        assert idle[rank] >= 0
        assert busy[rank] + idle[rank] == pytest.approx(timeline.makespan)
    assert timeline.start == 0.0


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_schedule_is_read_from_the_traces_alone(recorded, name):
    sched, folder, _ = recorded[name]
    traced = pl.Timeline.from_torch_trace(sorted(folder.glob("rank*.json")))
    assert traced.schedule.actions == sched.actions
    assert traced.schedule.placement == sched.placement      # dualpipe-v's V comes back a V
    assert traced.schedule.microbatches == sched.microbatches


def test_a_trace_of_another_schedule_is_named(recorded):
    _sched, folder, _ = recorded["1f1b"]
    with pytest.raises(ValueError, match=r"rank \d's trace runs \d[FB]\d at position \d+, where "
                                         r"schedule 'gpipe' has"):
        pl.Timeline.from_torch_trace(folder, schedule=pl.schedule("gpipe", ranks=2,
                                                                  microbatches=8))


def _stretch(res) -> float:
    """Wall-clock over thread CPU time of a run's actions (the engine reads both): how much
    other programs stretched this run, measured during it (the load average lags a burst)."""
    return sum(e.duration for e in res.timeline.events) / \
        sum(e.cpu for e in res.timeline.events)


def _fit_check(measured: dict, expected: dict, what: str, tolerance: float = 0.20,
               stretch: float = 1.0) -> None:
    """Assert every measured cost within `tolerance` of its expected one, unless the machine was
    too loaded to resolve it (then skip, printing the figures)."""
    ratios = {key: measured[key] / expected[key] for key in expected}
    figures = (", ".join(f"{k} {measured[k] * 1e3:.2f}/{expected[k] * 1e3:.2f} ms "
                         f"({r:.2f})" for k, r in ratios.items())
               + f"; runs stretched {stretch:.2f}x; {load_line()}")
    print(f"{what}: {figures}")
    off = {k: r for k, r in ratios.items() if abs(r - 1) > tolerance}
    if off and (load_average() > 2 * (os.cpu_count() or 1) or stretch > 1 + tolerance):
        # A profiler trace holds wall-clock spans only; with more runnable programs than cores
        # every span is stretched by the others' slices (measured here at load 7 on 2 cores:
        # median spans 1.8-6.7x the thread CPU, the shortest ones 0.9-2.9x).
        pytest.skip(f"{what}: not resolvable at this load: {figures}")
    assert not off, f"{what}: {figures}"


@pytest.mark.timing
def test_fitted_costs_match_pipelabs_calibration(recorded, clusters, tmp_path):
    """F and the full backward B per stage, fitted from torch's traces of three runs (the
    shortest span of each: other programs only ever lengthen one), against `calibrate` on the
    same model. (zb-h1 is not compared: torch 2.13's split backward of the loss stage costs
    about 1.65x its full backward here, and `calibrate` splits B by FLOPs.)"""
    sched, folder, res = recorded["1f1b"]
    folders, stretch = [folder], [_stretch(res)]
    for k in range(2):                         # two more traced runs: more chances of a quiet span
        folders.append(tmp_path / f"again{k}")
        again = clusters(2).run(sched, model=CFG, engine="torch", torch_trace=str(folders[-1]),
                                steps=2, batch_size=ROWS * sched.microbatches, progress=False,
                                check=False)
        stretch.append(_stretch(again))
    fits = [pl.Costs.fit(pl.Timeline.from_torch_trace(f, schedule=sched), sched.stages,
                         statistic="min") for f in folders]
    cal = calibrate(CFG)
    measured, expected = {}, {}
    for stage, (start, stop) in enumerate(res.spec.bounds):
        i, w = cal.backward_time(start, stop, ROWS)
        measured[f"F{stage}"] = min(fit.F[stage] for fit in fits)
        measured[f"B{stage}"] = min(fit.B[stage] for fit in fits)
        expected[f"F{stage}"], expected[f"B{stage}"] = cal.forward_time(start, stop, ROWS), i + w
    _fit_check(measured, expected, "1f1b on torch's runtime vs calibrate", stretch=min(stretch))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_trace_spans_are_the_engines_own_clocks(recorded, name):
    """The same step timed twice: by torch.profiler (the trace) and by the engine's clocks
    around torch's regions, the receive wait kept out of both. Both are wall-clock spans of
    the same step, stretched alike by any load. (zb-h1's first stage runs I in ~0.1 ms: its
    input is token ids; the whole region is the wait for the gradient.)"""
    sched, folder, res = recorded[name]
    traced = pl.Timeline.from_torch_trace(folder, schedule=sched)
    clocks = {(e.rank, e.action): e for e in res.timeline.events}
    assert len(clocks) == len(traced.events)
    apart = [(str(e.action), round(e.duration * 1e3, 2), round(clocks[(e.rank, e.action)]
              .duration * 1e3, 2)) for e in traced.events
             if abs(e.duration - clocks[(e.rank, e.action)].duration)
             > 5e-4 + 0.05 * clocks[(e.rank, e.action)].duration]
    # A preemption between torch's region opening and the engine's clock read (the two are a
    # few statements apart) stretches one reading only: measured once in 128 events at load 5.
    if len(apart) > 0.1 * len(traced.events) and os.getloadavg()[0] > (os.cpu_count() or 1):
        # both are wall-clock spans: on a busy machine a preemption may land inside one reading
        # and not the other, more often than once in ten (a CI run at load 3 on 2 cores did)
        pytest.skip(f"not resolvable at load {os.getloadavg()[0]:.1f}: {len(apart)} of "
                    f"{len(traced.events)} spans apart")
    assert len(apart) <= 0.1 * len(traced.events), f"trace vs clocks (ms): {apart}"


# --- hand-written traces: the reader's rules, exactly -------------------------------------------
def _trace(path, regions, ops=(), rank=None) -> str:
    """A Chrome trace with PP regions [(name, ts µs, dur µs)] and operators [(ts, dur)]."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"PP:{n}", "pid": 1, "tid": 1,
               "ts": ts, "dur": dur} for n, ts, dur in regions]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts,
                "dur": dur} for ts, dur in ops]
    data = {"traceEvents": events}
    if rank is not None:
        data["distributedInfo"] = {"rank": rank}
    path.write_text(json.dumps(data))
    return str(path)


def test_without_receive_regions_an_event_starts_at_its_first_operator(tmp_path):
    r0 = _trace(tmp_path / "rank0.json",
                [("0UNSHARD", 0, 1), ("0F0", 10, 100), ("0SEND_F0", 110, 5),
                 ("0RECV_B0", 120, 2), ("0B0", 130, 300), ("0REDUCE_GRAD", 440, 3)],
                ops=[(12, 50), (200, 100)])
    r1 = _trace(tmp_path / "rank1.json",
                [("1RECV_F0", 5, 1), ("1F0", 20, 150), ("1B0", 180, 100)],
                ops=[(120, 40), (181, 90)])
    timeline = pl.Timeline.from_torch_trace([r0, r1])
    got = {(e.rank, str(e.action)): (round(e.start * 1e6), round(e.end * 1e6))
           for e in timeline.events}
    # times from the earliest event (0F0's first operator at 12 µs)
    assert got == {(0, "0F0"): (0, 98), (0, "0B0"): (188, 418),
                   (1, "1F0"): (108, 158), (1, "1B0"): (169, 268)}


def test_an_event_starts_when_its_last_receive_completed(tmp_path):
    def trace(path, regions, received):
        _trace(path, regions)
        data = json.loads(path.read_text())
        data["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "gloo:recv",
                                 "pid": 1, "tid": 1, "ts": ts, "dur": dur} for ts, dur in received]
        path.write_text(json.dumps(data))
        return str(path)
    r0 = trace(tmp_path / "rank0.json", [("0F0", 0, 10), ("0RECV_B0", 10, 1), ("0B0", 11, 100)],
               received=[(10, 60)])                      # the gradient arrived at 70 µs
    r1 = trace(tmp_path / "rank1.json", [("1RECV_F0", 0, 1), ("1F0", 1, 30), ("1B0", 31, 20)],
               received=[(0, 12)])                       # the activation arrived at 12 µs
    timeline = pl.Timeline.from_torch_trace([r0, r1])
    got = {str(e.action): (round(e.start * 1e6), round(e.end * 1e6)) for e in timeline.events}
    assert got == {"0F0": (0, 10), "0B0": (70, 111), "1F0": (12, 31), "1B0": (31, 51)}


def test_a_pair_is_one_event(tmp_path):
    path = _trace(tmp_path / "rank0.json",
                  [("0F0", 0, 10), ("1F0", 10, 10), ("(0F1;1B0)OVERLAP_F_B", 20, 20),
                   ("1F1", 40, 10), ("1B1", 50, 10), ("0B0", 60, 10), ("0B1", 70, 10)])
    timeline = pl.Timeline.from_torch_trace([path])
    pair = timeline.events[2]
    assert [str(p) for p in pair.action.parts] == ["0F1", "1B0"]
    assert round(pair.duration * 1e6) == 20 and len(timeline.events) == 7
    assert timeline.schedule.placement == (0, 0)


def test_several_steps_in_one_trace_pick_one(tmp_path):
    regions = [("0F0", 0, 10), ("0B0", 10, 10), ("0F0", 100, 30), ("0B0", 130, 30)]
    path = _trace(tmp_path / "rank0.json", regions)
    last = pl.Timeline.from_torch_trace([path])
    first = pl.Timeline.from_torch_trace([path], step=0)
    assert [round(e.duration * 1e6) for e in last.events] == [30, 30]
    assert [round(e.duration * 1e6) for e in first.events] == [10, 10]
    with pytest.raises(ValueError, match="step 2 is out of range"):
        pl.Timeline.from_torch_trace([path], step=2)


@pytest.mark.parametrize("make, words", [
    (lambda d: str(d / "nowhere"), "is not a folder"),
    (lambda d: [], "lists no trace"),
    (lambda d: [str(d / "missing.json")], "does not exist"),
    (lambda d: (d / "rank0.json").write_text("{not json") and [str(d / "rank0.json")],
     "cannot read trace"),
    (lambda d: _trace(d / "rank0.json", [("0SEND_F0", 0, 1)]) and [str(d / "rank0.json")],
     "no PP:<action> region"),
    (lambda d: _trace(d / "rank0.json", [("0X0", 0, 1)]) and [str(d / "rank0.json")],
     "cannot read '0X0'"),
    (lambda d: _trace(d / "rank0.json", [("0F0", 0, 1), ("0B0", 1, 1), ("0F0", 2, 1)])
     and [str(d / "rank0.json")], "different numbers of times"),
])
def test_bad_traces_give_a_clear_error(make, words, tmp_path):
    with pytest.raises(ValueError, match=words):
        pl.Timeline.from_torch_trace(make(tmp_path))


def test_costs_fit_takes_the_median_or_the_shortest(tmp_path):
    path = _trace(tmp_path / "rank0.json", [("0F0", 0, 10), ("0F1", 10, 30), ("0F2", 40, 20),
                                            ("0B0", 60, 40), ("0B1", 100, 40), ("0B2", 140, 40)])
    timeline = pl.Timeline.from_torch_trace([path])
    assert pl.Costs.fit(timeline, 1).F[0] == pytest.approx(20e-6)
    assert pl.Costs.fit(timeline, 1, statistic="min").F[0] == pytest.approx(10e-6)
    with pytest.raises(ValueError, match="statistic must be one of 'median', 'min'"):
        pl.Costs.fit(timeline, 1, statistic="mean")
