"""A technique registered outside pipelab, as a chapter or a user would: a probe that rides
along with any run whose schedule has the SY kind (pipelab_test_kinds.py).

The workers import this module by name (the run spec lists it as a plugin), which registers
the technique there too; its setup hook notes the process's pid in the rank's report, so a
test can tell the hook ran in the worker, not in the parent.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import pipelab_test_kinds  # noqa: F401 - the SY kind and handler it rides with

from pipelab.runtime.techniques import TECHNIQUES, Technique, register_technique


def prepare(draft) -> bool:
    return "SY" in draft.schedule.kinds()


def setup(run) -> None:
    run.report["probe_pid"] = os.getpid()


@contextmanager
def step(run, state):
    yield
    run.report["steps"][-1]["probed"] = True


def assemble(assembly) -> None:
    assembly.result.probed = [rep.get("probe_pid") for rep in assembly.every]


if "probe" not in TECHNIQUES:
    register_technique(Technique("probe", prepare=prepare, setup=setup, step=step,
                                 assemble=assemble))
