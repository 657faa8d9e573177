"""Notebooks 03 and 04's helper: the critical path's rank crossings, numbered and grouped into
round trips, and drawn as numbers on a Gantt chart that `plot_gantt(critical_path=True)` drew.

Data first, drawing second: `crossings` returns the list the notebooks assert on and
`number_crossings` labels exactly those crossings.
"""
from __future__ import annotations

from typing import NamedTuple

from ..sim.timeline import Timeline


class Crossing(NamedTuple):
    """One message on the critical path: from the end of `sender` (an action of stage
    `from_stage`) on `from_rank` to the start of `receiver` on `to_rank` (numbered from 1 in
    path order)."""
    number: int
    from_rank: int
    to_rank: int
    sent: float
    received: float
    sender: str
    receiver: str
    from_stage: int
    to_stage: int

    @property
    def down(self) -> bool:
        """Towards the last stage (a forward's activation), else back up (a gradient). By stage,
        not rank: in a loop, stage 3 on rank 3 sends down to stage 4 on rank 0."""
        return self.to_stage > self.from_stage


def crossings(timeline: Timeline, path=None) -> list[Crossing]:
    """The rank crossings on the critical path, in order (the path `Timeline.critical_path`
    walks; its `path_summary().crossings` counts the same steps)."""
    path = timeline.critical_path() if path is None else path
    found = []
    for before, step in zip(path, path[1:]):
        if step.edge == "data" and before.event.rank != step.event.rank:
            found.append(Crossing(len(found) + 1, before.event.rank, step.event.rank,
                                  before.event.end, step.event.start,
                                  str(before.event.action), str(step.event.action),
                                  before.event.action.stage, step.event.action.stage))
    return found


def round_trips(found: list[Crossing]) -> list[list[Crossing]]:
    """The crossings grouped into round trips: a trip goes down, turns at the bottom and comes
    back up; a crossing going down after one going up starts the next trip."""
    trips: list[list[Crossing]] = []
    for c in found:
        if not trips or (c.down and not trips[-1][-1].down):
            trips.append([])
        trips[-1].append(c)
    return trips


def number_crossings(ax, timeline: Timeline, found: list[Crossing] | None = None):
    """Writes each crossing's number in a circle at the middle of its arrow on `ax` (a chart of
    `timeline` from `plot_gantt`), and returns the crossings drawn."""
    from ..views.plots import PATH_COLOUR
    found = crossings(timeline) if found is None else found
    scale = 1e3 if timeline.time_unit == "s" else 1.0
    t0 = timeline.start
    for c in found:
        x = ((c.sent + c.received) / 2 - t0) * scale
        y = (c.from_rank + c.to_rank) / 2
        ax.annotate(str(c.number), (x, y), ha="center", va="center", fontsize=7,
                    color=PATH_COLOUR, fontweight="bold", zorder=6,
                    bbox=dict(boxstyle="circle,pad=0.15", facecolor="white",
                              edgecolor=PATH_COLOUR, linewidth=0.8))
    return found
