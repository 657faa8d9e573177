"""The "write your own schedule" workbench (notebook 13): a text goes through reading,
validation, simulation, a live run and the exercise's goal; every mistake comes back as a
sentence (with the grid where the validator has one), never as a traceback."""
from __future__ import annotations

import pytest

import pipelab as pl
from pipelab.chapters.write_your_own_schedule import exercises, workbench
from pipelab.chapters.write_your_own_schedule.exercises import EXERCISES

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.title for e in EXERCISES])
def test_solutions_pass_and_starters_do_not(ex):
    good = workbench.attempt(ex.solution, ex)
    assert good.passed, good.problem
    bad = workbench.attempt(ex.starter, ex)
    assert not bad.passed and bad.problem


def test_what_each_starter_is_missing():
    """The starting texts fail for the reason the task names."""
    deadlock, gpipe, ofob, h1 = (workbench.attempt(e.starter, e) for e in EXERCISES)
    assert deadlock.stage == "validate" and "deadlock" in deadlock.problem
    assert "rank 1 waits for 0F1" in deadlock.problem and "step | rank 0" in deadlock.problem
    assert "rank 0 holds 4" in gpipe.problem and "the limit is 3" in gpipe.problem
    assert "1f1b takes 18" in ofob.problem
    assert "zb-h1 takes 24" in h1.problem


def test_solutions_are_the_textbook_schedules():
    """Exercise 2's answer is 1F1B; exercise 3's is ZB-H1 (their generators agree)."""
    assert workbench.read(exercises.ONE_F_ONE_B.solution, 3, 4).actions == \
        pl.schedule("1f1b", ranks=3, microbatches=4).actions
    assert workbench.read(exercises.SPLIT.solution, 3, 4).actions == \
        pl.schedule("zb-h1", ranks=3, microbatches=4).actions
    limited = workbench.attempt(exercises.LIMITED.solution, exercises.LIMITED)
    auto = pl.simulate(pl.schedule("zb-auto", ranks=3, microbatches=6,
                                   costs=exercises.LIMITED.costs,
                                   memory_limit=exercises.MEMORY_LIMIT), exercises.LIMITED.costs)
    assert auto.makespan <= limited.simulated.makespan < 24


@pytest.mark.parametrize("text,words", [
    ("", "write one line per rank (3 lines)"),
    ("0F0 0B0\n1F0 1B0", "this exercise has 3 ranks: write 3 lines"),
    ("   \n\n", "write one line per rank (3 lines)"),
    (None, "write one line per rank (3 lines)"),
    ("0F0 0B0\n1F0 1B0\n2F0 2B0\n3F0 3B0", "write 3 lines, one per rank (found 4)"),
    ("0F0 0B0\n1F0 1B0\n2F0 2X0", "line 3: unknown action kind 'X' in '2X0'"),
    ("0F0 0B0\n1f0 1B0\n2F0 2B0", "line 2: cannot read action '1f0'"),
    ("0F0 0B0\n1f0 1B0\n2F0 2B0", "(kinds are capital letters: 1F0)"),
    ("0F0 0B0\n1F0 1B0\nhello", "line 3: cannot read action 'hello'"),
    ("rank 0: 0F0 0B0\nrank 1: 1F0 1B0\nrank 5: 2F0 2B0", "rank 2 has no line"),
    ("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1\n2F0 2B0 2F1 2B1", "deadlock"),
    ("0F0\n1F0 1B0 0B0\n2F0 2B0", "0B0 is on rank 1, but stage 0 lives on rank 0"),
    ("0F0 0B0\n1F0 1B0\n2F0", "stage 2 never runs the backward of microbatch 0"),
    ("0F0 0B0\n1F0 1B0\n2F0 2B0 2F1 2B1", "names microbatch 1, but microbatches are 0..0"),
])
def test_mistakes_are_sentences(text, words):
    """Each mistake is one line (the validator's adds its grid after a blank line), naming
    where it is; none is a traceback."""
    att = workbench.attempt(text, ranks=3, microbatches=2 if "deadlock" == words else 1)
    assert not att.passed and words in att.problem, att.problem
    sentence, _, grid = att.problem.partition("\n")
    assert "Traceback" not in att.problem and (not grid or "step | rank 0" in grid), att.problem


def test_free_play_without_an_exercise():
    att = workbench.attempt("0F0 0I0 0W0\n1F0 1I0 1W0", ranks=2, microbatches=1,
                            costs=pl.Costs(F=1, I=2, W=0.5))
    assert att.passed and att.simulated.makespan == 1 + 1 + 2 + 2 + 0.5
    short = workbench.attempt("0F0 0B0\n1F0 1B0", ranks=2, microbatches=1, costs=pl.Costs(F=[1]))
    assert short.problem.startswith("cannot simulate it: Costs.F has 1 values; a rank's worth")


def test_live_solutions_are_exact_and_failures_are_sentences(clusters, monkeypatch):
    cluster = clusters(3)
    for ex in EXERCISES:
        att = workbench.attempt(ex.solution, ex, cluster=cluster, model=CFG)
        assert att.passed, (ex.title, att.problem)
        assert att.run.max_grad_error <= 1e-5
        for rank in range(3):
            assert [e.action for e in att.run.timeline.events_of(rank)] == att.schedule.actions[rank]
    # a cluster of the wrong size, a worker that fails, gradients that drift: one sentence each
    wrong = workbench.attempt("0F0 0B0\n1F0 1B0", ranks=2, microbatches=1, cluster=cluster, model=CFG)
    assert "the cluster has 3 ranks and the schedule 2" in wrong.problem
    ex = EXERCISES[0]

    def broken(*_a, **_k):
        raise pl.WorkerError("rank 1 failed in 1F0: RuntimeError: boom\nTraceback (most recent...)")
    monkeypatch.setattr(cluster, "run", broken)
    failed = workbench.attempt(ex.solution, ex, cluster=cluster, model=CFG)
    assert failed.problem == "the live run stopped: rank 1 failed in 1F0: RuntimeError: boom"
    monkeypatch.undo()
    real_run = cluster.run

    def drifting(*a, **k):
        res = real_run(*a, **k)
        res.max_grad_error = 1e-3
        return res
    monkeypatch.setattr(cluster, "run", drifting)
    drift = workbench.attempt(ex.solution, ex, cluster=cluster, model=CFG)
    assert "gradients differ from the unsplit model's by 1.0e-03" in drift.problem


def test_widget_buttons(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    bench = workbench.Workbench(exercises.SPLIT)
    assert bench.text.value.strip() == exercises.SPLIT.starter.strip()
    assert not bench.check().passed
    bench.text.value = exercises.SPLIT.solution
    bench.check_button.click()
    assert bench.last.passed
    assert bench.solution.value == ""           # the solution is shown only on request
    bench.solution_button.click()
    assert exercises.SPLIT.solution.splitlines()[1] in bench.solution.value


def test_check_says_it_is_checking_before_the_verdict_arrives(monkeypatch):
    """While a check runs (seconds, when it runs live), the old verdict is gone and a status line
    says what is being done; the verdict replaces it at the end."""
    import matplotlib
    matplotlib.use("Agg")
    bench = workbench.Workbench(exercises.SPLIT)
    bench.output.outputs = ({"output_type": "stream", "name": "stdout", "text": "✘ the old verdict"},)
    seen = []
    bench.status.observe(lambda change: seen.append(change.new), names="value")
    real_attempt = workbench.attempt
    at_start = {}

    def watched(*args, **kwargs):
        at_start.update(outputs=bench.output.outputs, status=bench.status.value,
                        disabled=bench.check_button.disabled)
        return real_attempt(*args, **kwargs)

    monkeypatch.setattr(workbench, "attempt", watched)
    bench.text.value = exercises.SPLIT.solution
    att = bench.check()
    assert at_start["outputs"] == () and "checking" in at_start["status"]
    assert at_start["disabled"] and not bench.check_button.disabled
    steps = [s for s in seen if "checking" in s]
    assert any("validating" in s for s in steps) and any("simulating" in s for s in steps)
    assert any("checking the goal" in s for s in steps)
    assert att.passed and "✔ passed" in bench.status.value


def test_progress_names_each_step_in_order(clusters):
    steps = []
    att = workbench.attempt(exercises.SPLIT.solution, exercises.SPLIT, cluster=clusters(3),
                            model=CFG, progress=steps.append)
    assert att.passed
    assert steps == ["reading and validating", "simulating",
                     "running live on 3 processes and comparing every gradient", "checking the goal"]
    assert "ran at load average" in att.report()      # a live check says the load it ran at
    bad = []
    workbench.attempt("0F0 0B0\n1F0 1B0", ranks=3, microbatches=1, progress=bad.append)
    assert bad == ["reading and validating"]          # stops where the text fails


def test_check_renders_in_the_kernel_and_shows_an_unexpected_error(monkeypatch):
    """Notebook 13 calls check() in a cell: its report is rendered kernel-side (`with out:` or the
    widget's clear_output() can hang a headless executor, so any use fails here). An unexpected
    error (not a mistake in the text) is shown in the output, named in the status, and raised."""
    import ipywidgets as w
    import matplotlib
    matplotlib.use("Agg")
    from pipelab.views import ui

    def captured(*_):
        raise AssertionError("output routed through the Output widget")
    monkeypatch.setattr(w.Output, "__enter__", captured)
    bench = workbench.Workbench(exercises.SPLIT)
    att = bench.check()
    assert not att.passed and bench.last is att
    assert ui.text_of(bench.output) == att.report() + "\n"

    def broken(*args, **kwargs):
        raise RuntimeError("the cluster went away")
    monkeypatch.setattr(workbench, "attempt", broken)
    with pytest.raises(RuntimeError, match="the cluster went away"):
        bench.check()
    assert bench.output.outputs[-1]["output_type"] == "error"
    assert "failed" in bench.status.value and not bench.check_button.disabled


def test_a_closed_cluster_is_restarted_once_and_says_so(clusters):
    cluster = clusters(3)
    cluster.close()                                  # as notebook 13's last cell does
    steps = []
    att = workbench.attempt(exercises.SPLIT.solution, exercises.SPLIT, cluster=cluster,
                            model=CFG, progress=steps.append)
    assert att.passed and cluster.pids                # running again, for the next checks
    assert steps[2].startswith("starting 3 worker processes again")
    again = []
    workbench.attempt(exercises.SPLIT.solution, exercises.SPLIT, cluster=cluster, model=CFG,
                      progress=again.append)
    assert not any(s.startswith("starting") for s in again)     # once only
