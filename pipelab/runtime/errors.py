"""The ways a pipeline run can fail, each saying which rank, which action and why."""
from __future__ import annotations


class PipelineTimeout(TimeoutError):
    """A rank made no progress for longer than the run's timeout.

    `rank` and `action` name the rank to blame (the one at the end of the chain of waits) and
    what it was doing; `transfer` is the message it waited for (None if it was computing);
    `waited` is how long it had been stuck; `states` describes every rank. The message ends
    with the schedule grid, each rank's current step marked.
    """

    def __init__(self, message: str, rank: int, action=None, transfer=None,
                 waited: float = 0.0, states: list[str] | None = None):
        super().__init__(message)
        self.rank = rank
        self.action = action
        self.transfer = transfer
        self.waited = waited
        self.states = states or []


class WorkerError(RuntimeError):
    """A worker raised an exception or died. `traceback` is the worker's own traceback text."""

    def __init__(self, message: str, rank: int | None = None, action=None,
                 traceback: str = "", exitcode: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.action = action
        self.traceback = traceback
        self.exitcode = exitcode
