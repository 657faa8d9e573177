"""Hardening, third round (issue 36): a user's broken model is caught, not trained; every refusal
names the rule and the parameter; no size or count takes long to refuse; make test holds on a
busy machine. Broken models live in tests/pipelab_test_broken.py (the workers import them)."""
from __future__ import annotations

import time
import warnings

import pytest

import pipelab as pl
from pipelab.runtime.exactness import InexactRunWarning
from pipelab.runtime.spec import prepare_run

pytestmark = pytest.mark.timeout(300)

BROKEN = "pipelab_test_broken"
SCHED = pl.schedule("1f1b", ranks=2, microbatches=4)


def custom(layers="layers", loss="loss", batch="batch") -> pl.CustomModel:
    return pl.CustomModel(f"{BROKEN}:{layers}", f"{BROKEN}:{loss}", f"{BROKEN}:{batch}")


def cpu_refused(call, *needles: str, within: float = 0.1) -> str:
    """The ValueError `call` raises within `within` seconds of this process's CPU time (a busy
    machine stretches wall time, not CPU time), with every needle in its message."""
    began = time.process_time()
    with pytest.raises(ValueError) as info:
        call()
    took = time.process_time() - began
    assert took < within, f"took {took * 1e3:.0f} ms of CPU time"
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- 1. a broken custom model is caught -------------------------------------------------------
@pytest.mark.parametrize("names, needles", [
    (dict(layers="pid_layers"), ["pid_layers", "layer 0 in another process", "process id"]),
    (dict(layers="repeated_layers"), ["same module object as layers 1 and 3"]),
    (dict(batch="unseeded_batch"), ["different data on two calls", "manual_seed(seed)"]),
    (dict(batch="fixed_batch"), ["ignores its seed", "seeds 0 and 1"]),
    (dict(batch="nan_batch"), ["inputs with NaN"]),
    (dict(loss="summed_loss"), ["average", "ratio 4", "reduction='mean'"]),
    (dict(loss="nan_loss"), ["is nan", "NaN or infinite loss"]),
])
def test_broken_custom_models_refused_before_workers(names, needles):
    with pytest.raises(ValueError) as info:
        prepare_run(SCHED, ranks=2, model=custom(**names))
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_the_good_model_passes_the_checks():
    prepare_run(SCHED, ranks=2, model=custom())
    assert custom().inexact() == []


def test_a_failed_gradient_check_is_loud(clusters):
    # Doubles its input only in a worker: no check before the run can see it.
    with pytest.warns(InexactRunWarning, match=r"NOT EXACT.*stage 0 \(rank 0, layers 0..2\)"
                                               r".*likely causes"):
        res = clusters(2).run(SCHED, model=custom(layers="worker_scaled_layers"), progress=False)
    assert any("likely causes" in why for why in res.inexact)
    assert "NOT EXACT: gradients differ" in res.table()


@pytest.mark.parametrize("layers, advice", [
    ("dropout_layers", "seed the dropout per microbatch"),
    ("batchnorm_layers", "use GroupNorm or LayerNorm"),
])
def test_inexact_by_design_said_before_and_marked(clusters, layers, advice):
    with pytest.warns(InexactRunWarning, match="will NOT be EXACT") as said:
        res = clusters(2).run(SCHED, model=custom(layers=layers), progress=False)
    assert advice in str(said[0].message)
    assert f"NOT EXACT: layer 2" in res.table() and advice in res.table()


def test_an_exact_custom_run_says_nothing(clusters):
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactRunWarning)
        res = clusters(2).run(SCHED, model=custom(), progress=False)
    assert res.inexact == [] and "NOT EXACT" not in res.table()
    assert res.max_grad_error < 1e-4
