"""Pictures of the lower floors' objects, drawn by the views floor.

A `Timeline` or a `Partition` (the simulator's floor) offers `.plot()`, but plotting lives in
`pipelab/views/`, a floor above it. So the views register their drawing functions here when
they are imported (`import pipelab` imports them), and `.plot()` asks for a picture by name:
the lower floor says what it wants drawn and never imports the floor that draws it.
"""
from __future__ import annotations

from typing import Callable

_DRAWERS: dict[str, Callable] = {}


def register_drawer(name: str, draw: Callable) -> None:
    """Make `draw(obj, **options)` the picture called `name` (e.g. "gantt")."""
    _DRAWERS[name] = draw


def draw(name: str, *args, **kwargs):
    """Draw the picture `name` with the function the views registered for it."""
    try:
        drawer = _DRAWERS[name]
    except KeyError:
        raise RuntimeError(f"no drawing registered for {name!r}: `import pipelab` loads the "
                           f"views that draw it (registered: {', '.join(_DRAWERS) or 'none'})") \
            from None
    return drawer(*args, **kwargs)
