"""The player's questions (what runs, what flies, what is live at t), the player and predict
widgets without a browser, and live_compare's fair ordering (with a stand-in cluster)."""
from __future__ import annotations

import os

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.views.player import (ARROWS_PER_LINK, arrows_to_draw, frame_times,  # noqa: E402
                                  live_activations, messages_in_flight, running_at, status)

COMM = pl.Costs(F=1.0, I=1.0, W=1.0, comm=0.5)


@pytest.fixture(scope="module")
def one_f():
    return pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), COMM)


def _names(running):
    return {r: (str(e.action) if e else None) for r, e in running.items()}


def test_a_deep_queue_draws_the_next_arrows_and_counts_the_rest():
    # rank 0 forwards twice as fast as the others: GPipe's activations pile up on link 0 -> 1
    tl = pl.simulate(pl.schedule("gpipe", ranks=4, microbatches=32),
                     pl.Costs(F=[1.0, 2.0, 2.0, 2.0], I=1.0, W=1.0, comm=0.2))
    t = max(frame_times([tl], 400), key=lambda t: len(messages_in_flight(tl, t)))
    flying = messages_in_flight(tl, t)
    drawn, more = arrows_to_draw(flying)
    queue = sorted((m for m in flying if (m.producer.rank, m.consumer.rank) == (0, 1)),
                   key=lambda m: m.consumer.start)
    assert len(queue) > 10
    assert [m for m in drawn if m.producer.rank == 0] == queue[:ARROWS_PER_LINK]  # next received
    assert more == [(queue[ARROWS_PER_LINK - 1], len(queue) - ARROWS_PER_LINK)]
    assert set(flying) - set(queue) <= set(drawn)           # short queues: every message drawn
    box = pl.explorer.player(tl)
    box.show(t)
    assert len(box.arrows) == len(drawn) + 1                 # the arrows and one "+k more queued"
    assert f"{len(flying)} message(s) in flight" in box.status.value


def test_running_at_uses_half_open_intervals(one_f):
    assert _names(running_at(one_f, 0.0)) == {0: "0F0", 1: None, 2: None, 3: None}
    assert _names(running_at(one_f, 0.999)) == {0: "0F0", 1: None, 2: None, 3: None}
    assert _names(running_at(one_f, 1.0))[0] == "0F1"       # 0F0 ended, 0F1 starts
    assert _names(running_at(one_f, 1.5)) == {0: "0F1", 1: "1F0", 2: None, 3: None}  # 1 + c
    assert _names(running_at(one_f, 10.6)) == {0: None, 1: "1B0", 2: "2F2", 3: None}
    assert all(e is None for e in running_at(one_f, one_f.makespan).values())


def test_messages_in_flight_between_send_and_receive(one_f):
    def flying(t):
        return sorted((str(m.producer.action), str(m.consumer.action), m.what)
                      for m in messages_in_flight(one_f, t))
    assert flying(0.5) == []
    assert flying(1.0) == [("0F0", "1F0", "activation")]     # sent at 1, received at 1.5
    assert flying(1.49) == [("0F0", "1F0", "activation")]
    assert flying(1.5) == []
    # 3B0 ends at 7.5; 2B0 starts 0.5 later: a gradient flies up
    assert ("3B0", "2B0", "gradient") in flying(7.6)
    for t in (2.0, 5.2, 10.6, 20.0):
        for m in messages_in_flight(one_f, t):
            assert m.producer.rank != m.consumer.rank
            assert m.producer.end <= t < m.consumer.start


def test_a_compound_step_sends_the_activation_its_forward_part_made():
    # rank 0's step 0F1+0B0 sends 0F1's activation to 1F1 (and reads 1B0's gradient)
    sched = pl.Schedule.from_text("0F0 0F1+0B0 0B1\n1F0 1B0 1F1 1B1")
    tl = pl.simulate(sched, COMM)
    sent = {(str(m.producer.action), str(m.consumer.action)): m.what
            for t in frame_times([tl], 400) for m in messages_in_flight(tl, t)}
    assert sent[("0F1+0B0", "1F1")] == "activation"
    assert sent[("1B0", "0F1+0B0")] == "gradient"


def test_live_activations_read_the_memory_curve(one_f):
    assert live_activations(one_f, 0.0) == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert live_activations(one_f, 5.2) == {0: 4.0, 1: 3.0, 2: 2.0, 3: 1.0}
    assert live_activations(one_f, one_f.makespan) == {r: 0.0 for r in range(4)}
    assert max(live_activations(one_f, t)[0] for t in frame_times([one_f])) == \
        one_f.peak_activations()[0]


def test_status_says_who_runs_and_what_the_idle_wait_for(one_f):
    lines = status(one_f, 0.5)
    assert lines[0] == "rank 0 runs 0F0; live activations 1"
    assert lines[1].startswith("rank 1 idle (waiting for 0F0's activation, rank 0 still computing")
    lines = status(one_f, 1.2)
    assert "waiting for 0F0's activation, in flight; next: 1F0" in lines[1]
    lines = status(one_f, 5.2)
    assert lines[0].startswith("rank 0 idle (waiting for 1B0's gradient")
    assert status(one_f, one_f.makespan)[3].startswith("rank 3 idle (done)")


def test_frames_visit_every_action():
    tl = pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=2))
    frames = frame_times([tl])
    assert frames[0] == 0.0 and frames[-1] == tl.makespan
    seen = {e for t in frames for e in running_at(tl, t).values() if e is not None}
    assert seen == set(tl.events)


def test_player_moves_highlights_with_the_slider(one_f):
    box = pl.explorer.player(one_f, critical_path=True)
    assert "pipelab-player" in box._dom_classes
    first_png = box.image.value
    before = {str(e.action) for e in box.highlighted[0]}
    assert before == {"0F0"}
    frame = next(k for k, t in enumerate(box.frames) if t >= 10.6)
    box.slider.value = frame
    t = box.frames[frame]
    assert box.highlighted[0] == {e for e in running_at(one_f, t).values() if e is not None}
    assert {str(e.action) for e in box.highlighted[0]} != before
    assert box.image.value != first_png                   # the picture moved too
    assert f"t = {t:.4g} units" in box.status.value
    assert "rank 1 runs" in box.status.value
    # the arrows drawn are the messages in flight
    assert len(box.arrows) == len(messages_in_flight(one_f, t)) > 0
    bars = box.gantt_axes[0].pipelab_bars
    lit = next(iter(box.highlighted[0]))
    def brightness(event):
        return sum(bars[event].get_facecolor()[:3])
    original = box.colours[0]
    assert bars[lit].get_facecolor() == original[lit]
    assert all(brightness(e) > sum(original[e][:3]) for e in bars if e not in box.highlighted[0])


def test_player_takes_several_timelines_a_schedule_and_chunks():
    sched = pl.schedule("gpipe", ranks=2, microbatches=3)
    measured_like = pl.simulate(sched, pl.Costs(F=0.002, I=0.002, W=0.002, unit="s"))
    replay = pl.simulate(sched, pl.Costs(F=0.001, I=0.0015, W=0.0015, unit="s"))
    box = pl.explorer.player([measured_like, replay], memory=True)
    assert len(box.gantt_axes) == 2 and len(box.memory_axes) == 2
    assert box.gantt_axes[0].get_xlim() == box.gantt_axes[1].get_xlim()      # one time axis
    box.slider.value = len(box.frames) // 3
    assert all(isinstance(h, set) for h in box.highlighted)
    from_schedule = pl.explorer.player(sched, memory=False)
    assert from_schedule.timelines[0].makespan == pl.simulate(sched).makespan
    chunks = pl.Schedule.from_text("0F0 2F0 2B0 0B0\n1F0 3F0 3B0 1B0", placement=[0, 1, 0, 1])
    split = pl.Schedule.from_text("0F0 0F1 0I0 0I1 0W0 0W1")
    for tl in (pl.simulate(chunks, COMM), pl.simulate(split)):
        box = pl.explorer.player(tl)
        seen = set()
        for k in range(1, len(box.frames), 2):      # every action's middle frame
            box.slider.value = k
            seen |= box.highlighted[0]
        assert seen == set(tl.events)         # every action lit once
    with pytest.raises(ValueError, match="Timelines or Schedules"):
        pl.explorer.player(["1f1b"])


def test_predict_numbers_with_tolerance_and_choices():
    q = pl.explorer.predict("1F1B makespan at p=4, m=8, c=0.5?", 41.0, tolerance=0.5,
                            unit="units", explain="latency on the critical path")
    assert q.answer == 41.0
    assert q.check(41) and q.check("41.4") and q.check("40.5") and not q.check("41.6")
    assert not q.check("forty") and not q.check("") and not q.check(float("nan"))
    q.field.value = "36"
    q.submit()
    assert "wrong" in q.result.value and "41 units" in q.result.value
    assert "latency on the critical path" in q.result.value
    q.field.value = "41"
    q.button.click()
    assert "right" in q.result.value and "wrong" not in q.result.value
    late = pl.explorer.predict("makespan?", 41.0)       # the click overtakes the typed value
    late.button.click()
    assert "type an answer first" in late.result.value
    late.field.value = "41"
    assert "right" in late.result.value
    exact = pl.explorer.predict("bubble?", 3 / 11)
    assert exact.check("3/11") and exact.check(3 / 11) and not exact.check("0.27")
    assert pl.explorer.predict("share?", 0.25, tolerance=0.001).check("25%")
    pick = pl.explorer.predict("faster?", "GPipe", choices=["GPipe", "1F1B"])
    assert pick.check("gpipe") and not pick.check("1F1B")
    pick.field.value = "1F1B"
    pick.submit()
    assert "wrong" in pick.result.value
    with pytest.raises(ValueError, match="not among the choices"):
        pl.explorer.predict("?", "x", choices=["a", "b"])


class _FakeCluster:
    """Records the order of runs; the makespan of each run comes from a list."""

    def __init__(self, times):
        self.calls, self.times = [], iter(times)

    def run(self, sched, **kwargs):
        self.calls.append((sched.name, kwargs))
        tl = SimpleNamespace(makespan=next(self.times))
        # load average when sent and when back: 1.0, 1.5, then 2.0, 2.5 ... run after run
        load = (1.0 + len(self.calls) - 1, 1.5 + len(self.calls) - 1)
        return SimpleNamespace(timeline=tl, schedule=sched, name=sched.name, load=load)


def test_live_compare_warms_up_then_alternates_and_keeps_the_median():
    a = pl.schedule("gpipe", ranks=2, microbatches=2)
    b = pl.schedule("1f1b", ranks=2, microbatches=2)
    #                  warm-up   r1 (a b)  r2 (b a)  r3 (a b)
    cluster = _FakeCluster([9, 9, 3.0, 5.0, 4.0, 1.0, 2.0, 6.0])
    live = pl.explorer.live_compare(cluster, [a, b], rounds=3, model="cfg", batch_size=4)
    assert [name for name, _ in cluster.calls] == ["gpipe", "1f1b", "gpipe", "1f1b", "1f1b",
                                                   "gpipe", "gpipe", "1f1b"]
    assert all(kw == {"model": "cfg", "batch_size": 4} for _, kw in cluster.calls)
    assert [r.timeline.makespan for r in live.runs["gpipe"]] == [3.0, 1.0, 2.0]
    assert [r.timeline.makespan for r in live.runs["1f1b"]] == [5.0, 4.0, 6.0]
    assert live["gpipe"].timeline.makespan == 2.0 and live["1f1b"].timeline.makespan == 5.0
    assert "gpipe" in live.table()
    # the load of the counted rounds only (runs 3..8), not of the discarded warm-ups
    assert live.table().splitlines()[-1] == \
        f"measured at load average 3.00 to 8.50 over 6 runs on {os.cpu_count()} cores"
    cold = _FakeCluster([1.0, 2.0])
    pl.explorer.live_compare(cold, {"x": a, "y": b}, rounds=1, warmup=False)
    assert len(cold.calls) == 2


def test_live_compare_takes_per_contender_run_settings():
    g = pl.schedule("gpipe", ranks=2, microbatches=2)
    #                 warm-up  r1 (u c)  r2 (c u)
    cluster = _FakeCluster([9, 9, 3.0, 5.0, 4.0, 1.0])
    live = pl.explorer.live_compare(
        cluster, {"uniform": (g, {"partition": "U"}), "cost": (g, {"partition": "C",
                                                                   "batch_size": 8})},
        rounds=2, model="cfg", batch_size=4)
    kwargs = [kw for _, kw in cluster.calls]
    assert [kw["partition"] for kw in kwargs] == ["U", "C", "U", "C", "C", "U"]
    assert all(kw["model"] == "cfg" for kw in kwargs)
    # the contender's own setting wins over the common one, and only for that contender
    assert [kw["batch_size"] for kw in kwargs] == [4, 8, 4, 8, 8, 4]
    assert [r.timeline.makespan for r in live.runs["uniform"]] == [3.0, 1.0]
    assert [r.timeline.makespan for r in live.runs["cost"]] == [5.0, 4.0]
    with pytest.raises(ValueError, match="run settings"):
        pl.explorer.live_compare(cluster, {"x": (g, {}, 3)})
    with pytest.raises(ValueError, match="run settings"):
        pl.explorer.live_compare(cluster, {"x": (g, "partition")})


def test_player_titles_one_per_timeline():
    from pipelab.views.player import headings
    a = pl.simulate(pl.schedule("gpipe", ranks=2, microbatches=2), pl.Costs())
    b = pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=2), pl.Costs())
    b.title = "own"
    assert headings([a, b], titles=["A", "B"]) == ["A", "B"]
    assert headings([a, b], titles=["A", None]) == ["A", "own"]
    assert headings([a, b], title="T") == ["T", "own"]
    with pytest.raises(ValueError, match="one per timeline"):
        headings([a, b], titles=["A"])
    with pytest.raises(ValueError, match="one per timeline"):
        headings([a, b], titles="AB")
    with pytest.raises(ValueError, match="not both"):
        headings([a, b], title="T", titles=["A", "B"])
    box = pl.explorer.player([a, b], titles=["first", "second"], memory=True)
    shown = [ax.get_title().split(" — ")[0] for ax in box.figure.axes]
    assert shown == ["first", "first", "second", "second"]
    assert b.title == "own"                   # the timelines themselves are left alone
    assert "second (simulated)" in box.status.value and "own (" not in box.status.value


@pytest.mark.parametrize("frames", [60, 150, 399, 2000])
def test_play_goes_through_any_timeline_in_ten_to_twenty_seconds(frames):
    from pipelab.views.player import playback
    first, step, interval = playback(frames)
    moves = (frames - 1 - first) / step
    assert moves == int(moves) and first < step            # the steps land on the last frame
    assert 10 <= moves * interval / 1000 <= 20
    assert interval >= 100                                  # a redraw has time to finish


def test_player_renders_at_display_size_and_plays_by_steps():
    import struct
    from pipelab.views.player import DISPLAY_WIDTH
    long = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=32), COMM)
    box = pl.explorer.player(long, memory=False)
    width, _height = struct.unpack(">II", box.image.value[16:24])     # the PNG header
    assert width == DISPLAY_WIDTH and box.image.layout.width == f"{DISPLAY_WIDTH}px"
    assert len(box.frames) == 121 and box.play.step == 1          # capped: every frame is played
    played = (box.play.max - box.play.min) / box.play.step * box.play.interval / 1000
    assert 10 <= played <= 20


def test_a_frame_inside_the_same_actions_only_moves_the_cursor(one_f):
    import io

    import numpy as np
    from PIL import Image
    box = pl.explorer.player(one_f)

    def state(t):
        return ({e for e in running_at(one_f, t).values() if e}, messages_in_flight(one_f, t))
    # the longest stretch of time with the same boxes running and the same messages flying
    times = [k / 20 for k in range(int(one_f.makespan * 20))]
    runs, start = [], times[0]
    for before, after in zip(times, times[1:]):
        if state(after) != state(before):
            runs.append((start, before))
            start = after
    a, b = max(runs, key=lambda run: run[1] - run[0])
    assert b - a >= 0.5
    box.show(a)
    draws, before = box.full_draws, box.image.value
    box.show(b)                         # the same boxes run, the same messages fly
    assert box.full_draws == draws and box.image.value != before
    # the blitted picture is what a full render of the same state shows (no cursor trail)
    blitted = np.asarray(Image.open(io.BytesIO(box.image.value)).convert("RGB"), dtype=int)
    buffer = io.BytesIO()
    box.figure.savefig(buffer, format="png", dpi=box.figure.dpi)
    full = np.asarray(Image.open(buffer).convert("RGB"), dtype=int)
    assert blitted.shape == full.shape
    assert (np.abs(blitted - full).max(axis=2) > 40).mean() < 1e-4
    box.show(11.2)                      # other boxes: a full redraw
    assert box.full_draws == draws + 1


def test_throttle_draws_the_newest_state_once_the_burst_is_over():
    import asyncio
    from pipelab.views.player import Throttle
    drawn, state = [], {"value": 0}
    throttle = Throttle(lambda: drawn.append(state["value"]), gap=0.05)

    async def burst():
        for value in range(1, 8):       # seven slider positions in quick succession
            state["value"] = value
            throttle.request()
        await asyncio.sleep(0.2)

    asyncio.run(burst())
    assert drawn == [1, 7]              # the first at once, then only the newest
    throttle.request()                  # outside an event loop: at once
    assert drawn == [1, 7, 7]


@pytest.mark.parametrize("first_in_seconds", [True, False])
def test_a_unit_timeline_beside_a_measured_one_keeps_its_own_axis(first_in_seconds):
    # The player shows timelines in other units at the same share of their makespan: a
    # unit-cost simulation beside a run in seconds spans its own makespan, whichever is first.
    sched = pl.schedule("1f1b", ranks=2, microbatches=4)
    seconds = pl.simulate(sched, pl.Costs(F=0.002, I=0.002, W=0.002, unit="s"))
    units = pl.simulate(sched, pl.Costs(F=1, I=1, W=1))
    pair = [seconds, units] if first_in_seconds else [units, seconds]
    box = pl.explorer.player(pair, memory=False)
    spans = {tl.time_unit: box.gantt_axes[i].get_xlim()[1] for i, tl in enumerate(pair)}
    assert spans["s"] == pytest.approx(seconds.makespan * 1e3)          # drawn in ms
    assert spans[units.time_unit] == pytest.approx(units.makespan)


def test_every_player_can_show_t0_and_plays_every_frame():
    import pipelab as pl
    big = pl.simulate(pl.schedule("1f1b", ranks=8, microbatches=32), pl.Costs())
    box = pl.explorer.player(big)
    assert len(box.frames) <= 121 and box.frames[0] == 0.0        # 399 frames before
    assert box.play.min == 0 and box.play.step == 1               # Play kept the slider off 0
    box.slider.value = 5
    box.slider.value = 0
    assert box.slider.value == 0 and "<b>t = 0 " in box.time_label.value


def test_messages_in_flight_at_t0_are_explained():
    import pipelab as pl
    from pipelab.views.player import flight_note, messages_in_flight
    v2 = pl.simulate(pl.schedule("vocab-2", ranks=4, microbatches=8), pl.Costs(F=1, I=1, W=1))
    flying = messages_in_flight(v2, 0.0)
    assert flying and all(m.producer.duration == 0 for m in flying)   # free vocabulary passes
    note = flight_note(flying, 0.0)
    assert note.startswith(f"{len(flying)} message(s) in flight ({len(flying)} sent by passes "
                           "that cost nothing here (") and "at t = 0, waiting" in note
    ofob = pl.simulate(pl.schedule("1f1b", ranks=4, microbatches=8), pl.Costs())
    assert messages_in_flight(ofob, 0.0) == [] and flight_note([], 0.0) == "no message in flight"


def test_pause_draws_the_slider_s_frame_at_once_and_play_is_paced_by_the_draw_cost():
    import pipelab as pl
    box = pl.explorer.player(pl.simulate(pl.schedule("1f1b", ranks=2, microbatches=4),
                                         pl.Costs()))
    import time
    drawn = []
    box.throttle.draw = lambda: (drawn.append(box.slider.value), time.sleep(0.4))
    box.play.playing = True
    box.slider.value = 3                          # a draw takes 0.4 s at this load
    assert box.play.interval >= 600               # the front end waits for the kernel
    box.slider.value = 4
    box.throttle.pending = type("Deferred", (), {"cancel": lambda self: drawn.append("x")})()
    box.play.playing = False                      # Pause: the queued draw dropped, this one now
    assert drawn[-2:] == ["x", 4] and box.throttle.pending is None
    assert box.play.interval == box.base_interval
