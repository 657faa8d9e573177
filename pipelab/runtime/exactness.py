"""Whether a run matched its unsplit model, said out loud: a custom model whose gradient check
fails is named with its stages and the likely causes (a warning, and NOT EXACT in the table),
never left as a number in a table; one that differs by design (Dropout, BatchNorm in training
mode) is announced before the run with what to do, and marked NOT EXACT after it.
"""
from __future__ import annotations

import math
import warnings

# A relative gradient error above this is a failed check: float32 pipelines of pipelab's own
# models differ from their unsplit stack by ~1e-6; a broken model by 0.5 and more.
GRAD_TOLERANCE = 1e-3

LIKELY_CAUSES = ("weights that differ between processes (drawn from the global generator, the "
                 "time or the process id), a random operation in a forward (functional dropout, "
                 "torch.rand), a module or weight used by two layers, a loss that is not a mean "
                 "over the rows, or a layer that mixes the rows of a batch (batch statistics)")


class InexactRunWarning(UserWarning):
    """A run that does not match its unsplit model (see pipelab/runtime/exactness.py)."""


def by_design(spec) -> list[str]:
    """Why this run differs from its unsplit model by design (the model's `inexact()`)."""
    inexact = getattr(spec.cfg, "inexact", None)
    return inexact() if callable(inexact) else []


def warn_before(spec) -> None:
    """Warn before a run whose model differs by design, saying what to do."""
    reasons = by_design(spec)
    if reasons:
        warnings.warn("this run will NOT be EXACT (it cannot match the unsplit model): "
                      + "; ".join(reasons), InexactRunWarning, stacklevel=3)


def failed_stages(res, tolerance: float = GRAD_TOLERANCE) -> list[tuple[int, float]]:
    """(stage, largest relative gradient error) of each stage whose parameters failed the check."""
    worst: dict[int, float] = {}
    for name, err in res.grad_errors.items():
        if not err <= tolerance:                 # NaN fails too
            layer = int(name.split(".")[1])
            for stage, (a, b) in enumerate(res.spec.bounds):
                if a <= layer < b:
                    worst[stage] = max(worst.get(stage, 0.0), err) if not math.isnan(err) else err
    return sorted(worst.items())


def judge(res) -> None:
    """Set `res.inexact` (why the run is NOT EXACT) and warn, naming the stages, when a custom
    model's run failed its check or its loss is not finite."""
    spec = res.spec
    reasons = by_design(spec)
    if not hasattr(spec.cfg, "inexact"):          # pipelab's own models: tested, not judged here
        res.inexact = reasons
        return
    failed = failed_stages(res) if res.max_grad_error is not None else []
    bad_loss = not math.isfinite(res.loss)
    if (failed or bad_loss) and not reasons:
        where = ", ".join(f"stage {s} (rank {spec.schedule.rank_of(s)}, layers "
                          f"{spec.bounds[s][0]}..{spec.bounds[s][1] - 1}): {e:.2g}"
                          for s, e in failed)
        what = (f"the loss is {res.loss}" if bad_loss else
                f"gradients differ from the unsplit model beyond {GRAD_TOLERANCE:g} (relative) "
                f"at {where}")
        reasons = [f"{what}; likely causes: {LIKELY_CAUSES}"]
        warnings.warn(f"{spec.schedule.name} run of {spec.cfg!r} is NOT EXACT: {reasons[0]}",
                      InexactRunWarning, stacklevel=3)
    res.inexact = reasons
