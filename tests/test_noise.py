"""The paired-rounds verdict: resolves a clear effect, refuses to call noise a result."""
import pytest

from pipelab.support import noise


def test_clear_effect_is_resolved():
    v = noise.verdict([1.0, 1.1, 0.9, 1.0, 1.05], [1.5, 1.6, 1.4, 1.5, 1.55], ("fast", "slow"))
    assert v.faster == "fast" and v.resolved
    assert 1.4 < v.ratio < 1.6
    assert "fast faster than slow" in str(v)


def test_b_faster_is_named():
    v = noise.verdict([2.0, 2.1, 1.9], [1.0, 1.0, 1.0], ("A", "B"))
    assert v.faster == "B"


def test_rounds_that_disagree_are_not_resolvable():
    # B is slower in most rounds but faster in two: the counted interval straddles 1.
    v = noise.verdict([1.0] * 5, [1.3, 1.2, 0.9, 0.8, 1.25], ("A", "B"))
    assert v.faster is None and not v.resolved
    assert "not resolvable" in str(v)


def test_one_outlier_round_does_not_decide():
    # Six rounds say A is 30% faster; one burst of load flips the seventh: still resolved.
    v = noise.verdict([1.0] * 7, [1.3, 1.3, 1.3, 1.3, 1.3, 1.3, 0.5], ("A", "B"))
    assert v.faster == "A"


def test_below_seven_rounds_every_round_must_agree():
    # Four of five rounds agree, but with five rounds none is dropped: not resolved.
    v = noise.verdict([1.0] * 5, [1.3, 1.3, 1.3, 1.3, 0.5], ("A", "B"))
    assert v.faster is None


def test_effect_inside_the_margin_is_not_claimed():
    v = noise.verdict([1.0] * 5, [1.03] * 5, ("A", "B"), margin=0.05)
    assert v.faster is None


def test_paired_rounds_alternates_and_times():
    calls = []
    v = noise.paired_rounds(lambda: calls.append("a") or 1.0, lambda: calls.append("b") or 2.0,
                            rounds=4, progress=False)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert v.faster == "A" and v.ratio == 2.0


@pytest.mark.parametrize("args", [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0])])
def test_bad_samples_refused(args):
    with pytest.raises(ValueError):
        noise.verdict(*args)


def test_bad_rounds_refused():
    with pytest.raises(ValueError, match="rounds"):
        noise.paired_rounds(lambda: 1.0, lambda: 1.0, rounds=0)


def test_status_line_waits_rewrites_in_place_and_erases():
    import io
    import time
    stream = io.StringIO()
    line = noise.StatusLine(enabled=True, delay=0.05, every=0.0, stream=stream)
    assert not line.update("too early") and stream.getvalue() == ""     # a quick run: nothing
    time.sleep(0.06)
    assert line.update("rank 0 at 3/8, a long line")
    assert line.update("rank 0 at 5/8")                                  # shorter: padded
    assert stream.getvalue() == "\rrank 0 at 3/8, a long line\rrank 0 at 5/8" + " " * 13
    line.close()
    assert stream.getvalue().endswith("\r" + " " * 13 + "\r")            # erased, cursor home
    quiet = noise.StatusLine(enabled=False, delay=0.0, stream=stream)
    before = stream.getvalue()
    assert not quiet.update("x") and stream.getvalue() == before


def test_status_line_rate_limit():
    import io
    stream = io.StringIO()
    line = noise.StatusLine(enabled=True, delay=0.0, every=60.0, stream=stream)
    assert line.update("first") and not line.update("second")
    assert line.update("forced", force=True)


def test_nobody_watches_plain_pytest():
    assert noise.watched() is False           # stderr captured, no kernel: no status lines


def test_cluster_status_says_where_each_rank_is():
    import pipelab as pl
    from pipelab.runtime.board import DONE, RUN, RankState
    from pipelab.runtime.cluster import _status
    from pipelab.runtime.spec import prepare_run
    spec = prepare_run(pl.schedule("1f1b", ranks=2, microbatches=2), ranks=2,
                       model=pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8))
    states = [RankState(0, 0, 3, RUN, 0, 0.0), RankState(1, 0, 4, DONE, 0, 0.0)]
    text = _status(spec, states, {}, 1.25)
    assert text.startswith("1f1b: actions 3/4 done · 1.2 s · load "), text


def test_a_live_run_records_the_load_it_ran_at(clusters, monkeypatch):
    import itertools

    import pipelab as pl
    readings = itertools.count(1.5)             # 1.5 when sent, 2.5 when back
    monkeypatch.setattr(noise, "load_average", lambda: next(readings))
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
    res = clusters(2).run(pl.schedule("gpipe", ranks=2, microbatches=2), model=cfg)
    assert res.load == (1.5, 2.5) and res.summary()["load"] == (1.5, 2.5)
    assert res.load_line.startswith("measured at load average 1.50 → 2.50 on ")
    assert repr(res).splitlines()[-1] == res.load_line


def test_the_replay_charges_each_action_its_least_inflated_step(clusters):
    import pipelab as pl
    cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
    res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=2), model=cfg, steps=3)
    readings: dict = {}
    for tl in res.timelines:                    # every step's measured CPU time per action
        for e in tl.events:
            readings.setdefault(e.action, []).append(e.cpu)
    assert all(len(r) == 3 for r in readings.values())
    replayed = {e.action: e.duration for e in res.replay.events}
    assert replayed.keys() == readings.keys()
    for action, cpu in readings.items():
        assert replayed[action] == pytest.approx(min(cpu), rel=1e-9, abs=1e-12)


def test_in_a_notebook_the_status_line_is_a_display_emptied_at_the_end(monkeypatch, capsys):
    # On stderr an erased line leaves a box of blanks under the cell: in a kernel the line is a
    # display of its own, updated in place and emptied by close().
    import IPython.display
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj)

    def display(obj, display_id=False):
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(noise, "in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    line = noise.StatusLine(enabled=True, delay=0, every=0)
    line.update("round 1 of 3")
    line.update("round 2 of 3")
    line.close()
    assert [getattr(o, "data", None) for o in shown] == ["round 1 of 3", "round 2 of 3", ""]
    assert capsys.readouterr().err == ""
