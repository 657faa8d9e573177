"""The step × rank grid: how a schedule prints, and how errors point at the bad step."""
from __future__ import annotations

from typing import Iterable

from .graph import execution_order, timed_run


def unit_steps(schedule) -> list[list[int]] | None:
    """Step at which each action runs if every action takes one step (None if it cannot run).

    This lines the ranks up the way the papers draw them, with the bubbles as empty cells.
    """
    try:
        order = execution_order(schedule)
    except Exception:
        return None
    steps: list[list[int]] = [[] for _ in schedule.actions]
    for rank, _action, start, _end in timed_run(order, lambda a: 1, lanes=False):
        steps[rank].append(int(start))
    return steps


def render_grid(schedule, mark: Iterable[tuple[int, int]] = (), window: int | None = None) -> str:
    """Rows are steps, columns ranks. `mark` holds (rank, position) pairs to bracket with >…<;
    a position past a rank's last action (something missing there) shows as `>?<` after it.

    With `window`, only the rows within `window` steps of a marked cell are shown.
    """
    marks = set(mark)
    steps = unit_steps(schedule) if not marks else None
    if steps is None:    # positional layout: step k is each rank's k-th action
        steps = [list(range(len(acts))) for acts in schedule.actions]
    n_rows = 1 + max((max(s) for s in steps if s), default=-1)
    cells = [["."] * schedule.ranks for _ in range(n_rows)]
    marked_rows = set()
    for rank, acts in enumerate(schedule.actions):
        for index, action in enumerate(acts):
            text = str(action)
            if (rank, index) in marks:
                text = f">{text}<"
                marked_rows.add(steps[rank][index])
            cells[steps[rank][index]][rank] = text
    for rank, index in sorted(marks):   # a marked position past the end: a missing action
        if index >= len(schedule.actions[rank]):
            row = steps[rank][-1] + 1 if steps[rank] else 0
            while len(cells) <= row:
                cells.append(["."] * schedule.ranks)
            cells[row][rank] = ">?<"
            marked_rows.add(row)
    n_rows = len(cells)

    width = max([len(f"rank {schedule.ranks - 1}")] + [len(c) for row in cells for c in row])
    header = "step | " + " ".join(f"rank {r}".ljust(width) for r in range(schedule.ranks))
    lines = [header, "-" * len(header)]
    shown = range(n_rows)
    if window is not None and marked_rows:
        lo, hi = max(0, min(marked_rows) - window), min(n_rows, max(marked_rows) + window + 1)
        shown = range(lo, hi)
        if lo > 0:
            lines.append(f"  ... {lo} earlier steps")
    for step in shown:
        flag = " <--" if step in marked_rows else ""
        lines.append(f"{step:4d} | " + " ".join(c.ljust(width) for c in cells[step]).rstrip() + flag)
    if window is not None and marked_rows and shown.stop < n_rows:
        lines.append(f"  ... {n_rows - shown.stop} later steps")
    return "\n".join(lines)
