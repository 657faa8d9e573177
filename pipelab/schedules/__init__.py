"""Floor 2, the schedule language: what each rank runs and in what order, as data.

    actions.py     Action, Compound: the words (`1F3`)  kinds.py     action kinds and their specs
    base.py        pl.Schedule: each rank's actions     grid.py      the step × rank grid, printed
    graph.py       the dataflow graph and a dry run     validate.py  checks that explain themselves
    errors.py      ScheduleError, its grid marked       comm.py      who sends what to whom, when
    placement.py   stage → rank (loop, V)               routes.py    routes through the model
    reductions.py  gradient sums as actions (G)         updates.py   updates and weight versions
    steps.py       several training steps in a row      registry.py  pl.schedule: by name
    gcpause.py     the cyclic GC paused around bulk work
    bulk.py        a plain schedule as arrays: its checks, edges and execution order in numpy

    generators, one file per family: gpipe.py, one_f_one_b.py, interleaved.py, zero_bubble.py,
    zb_auto.py, v_shape.py (V-Half, V-Min; the squeeze in v_squeeze.py), dualpipe.py and
    chimera.py (on two_way.py), stp.py, vocab.py (its base timed by vocab_timing.py), pipedream.py

Imports only `pipelab.checks`, `pipelab.support` and the model: a generator never imports the
simulator (zb-auto times its candidates with a small list scheduler of its own).
"""
from .actions import NO_MICROBATCH, Action, Compound
from .kinds import KIND_SPECS, KINDS, Input, KindSpec, register_kind
from . import reductions  # noqa: F401  (registers the replica sum G)
from .comm import Step, Transfer, comm_plan
from .placement import loop_placement, v_placement
from .registry import SCHEDULES, register, schedule
from .base import Schedule
from .graph import execution_order, timed_run
from .validate import ScheduleError, validate

# Generators register themselves on import.
from . import (chimera, dualpipe, gpipe, interleaved, one_f_one_b, pipedream, stp, v_shape, vocab,
               zero_bubble, zb_auto)
from . import vocab_vhalf  # noqa: F401  (v-half-vocab: vocabulary passes on V-Half)

__all__ = ["NO_MICROBATCH", "Action", "Compound", "KIND_SPECS", "KINDS", "Input", "KindSpec",
           "register_kind", "Step", "Transfer", "comm_plan", "loop_placement", "v_placement",
           "SCHEDULES", "register", "schedule", "Schedule", "ScheduleError", "execution_order",
           "timed_run", "validate"]
