"""One policy for every registry (action kinds, handlers, schedules, techniques).

A name belongs to the module that registered it. That module may register it again (a
notebook cell run twice, a module reloaded); any other module replacing it must say so with
`replace=True`, so a newcomer's `register_handler("F")` cannot silently swap out a built-in.
"""
from __future__ import annotations

import sys


def caller_module(depth: int = 2) -> str:
    """The `__name__` of the module `depth` frames above this call (2: the module that
    called the registering function that calls this)."""
    return sys._getframe(depth).f_globals.get("__name__", "__main__")


def claim(what: str, name: str, owner: str, held_by: str | None, replace: bool,
          hint: str = "choose another name") -> None:
    """Refuse `owner` taking `name` from the module `held_by` (None: the name is free)
    unless `replace` is true. `what` says which registry, for the message."""
    if held_by is None or held_by == owner or replace:
        return
    raise ValueError(f"{what} {name!r} is already registered by {held_by}; pass "
                     f"replace=True to replace it, or {hint}")
