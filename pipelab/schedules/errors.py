"""How a schedule says it cannot run: `ScheduleError`, its message ending in the schedule's
grid with the bad steps marked. Its own module: the validator and the dry run (graph.py) both
raise it, and the validator builds on the dry run."""
from __future__ import annotations


GRID_MAX_RANKS = 64      # an error message prints the grid only up to this many columns


class ScheduleError(ValueError):
    """A schedule that cannot run; the message shows the grid with the bad step marked."""

    def __init__(self, problem: str, schedule=None, mark=()):
        self.problem = problem
        self.mark = list(mark)
        text = problem
        if schedule is not None and schedule.ranks > GRID_MAX_RANKS:
            text += (f"\n\n(grid omitted: {schedule.ranks} ranks are too many columns to print; "
                     f"marked: {', '.join(f'rank {r} step {i}' for r, i in self.mark[:4])})")
        elif schedule is not None:
            text += "\n\n" + schedule.grid(mark=self.mark, window=6 if len(schedule) > 400 else None)
        super().__init__(text)
