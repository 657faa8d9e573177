"""The schedule language: actions, kinds, schedules, the dataflow graph, validation,
communication and the generators."""
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
from . import (chimera, dualpipe, gpipe, interleaved, one_f_one_b, pipedream, stp, vocab,
               zero_bubble, zb_auto)

__all__ = ["NO_MICROBATCH", "Action", "Compound", "KIND_SPECS", "KINDS", "Input", "KindSpec",
           "register_kind", "Step", "Transfer", "comm_plan", "loop_placement", "v_placement",
           "SCHEDULES", "register", "schedule", "Schedule", "ScheduleError", "execution_order",
           "timed_run", "validate"]
