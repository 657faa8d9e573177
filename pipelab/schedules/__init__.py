"""The schedule language: actions, schedules, validation, communication and the generators."""
from .actions import KINDS, Action, register_kind
from .comm import Step, Transfer, comm_plan
from .placement import loop_placement, v_placement
from .registry import SCHEDULES, register, schedule
from .base import Schedule
from .validate import ScheduleError, execution_order, validate

# Generators register themselves on import.
from . import gpipe, interleaved, one_f_one_b, zero_bubble  # noqa: E402,F401

__all__ = ["KINDS", "Action", "register_kind", "Step", "Transfer", "comm_plan", "loop_placement",
           "v_placement", "SCHEDULES", "register", "schedule", "Schedule", "ScheduleError",
           "execution_order", "validate"]
