"""Schedule generators by name: `schedule("1f1b", ranks=4, microbatches=8)`."""
from __future__ import annotations

import inspect
from typing import Callable

from ..checks import MAX_ACTIONS, MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES, at_most, positive_int
from ..support.registry import claim
from .gcpause import without_gc

SCHEDULES: dict[str, Callable] = {}
_OWNERS: dict[str, str] = {}          # name -> the module whose generator it is


def register(name: str, replace: bool = False) -> Callable:
    """Decorator: make a generator available as `schedule(name, ...)`. A name another module
    registered is replaced only with `replace=True` (the one policy: support/registry.py)."""
    def add(generator: Callable) -> Callable:
        owner = getattr(generator, "__module__", None) or "__main__"
        claim("schedule", name, owner, _OWNERS.get(name), replace)
        SCHEDULES[name] = generator = without_gc(generator)
        _OWNERS[name] = owner
        return generator
    return add


def schedule(name: str, ranks: int, microbatches: int, **options):
    """Build, validate and return the named schedule."""
    return build(name, ranks, microbatches, **options).validate()


def build(name: str, ranks: int, microbatches: int, **options):
    """The named schedule as its generator makes it, its arguments checked, not validated
    (the planner validates only the schedules it simulates)."""
    if not isinstance(name, str):
        raise ValueError(f"name must be one schedule's name as a str (e.g. '1f1b'), got "
                         f"{type(name).__name__} {name!r:.60}; registered schedules: "
                         f"{', '.join(SCHEDULES)}")
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; registered schedules: {', '.join(SCHEDULES)}")
    at_most("ranks", positive_int("ranks", ranks), MAX_RANKS)
    at_most("microbatches", positive_int("microbatches", microbatches), MAX_MICROBATCHES)
    generator = SCHEDULES[name]
    accepted = set(inspect.signature(generator).parameters) - {"ranks", "microbatches"}
    unknown = set(options) - accepted
    if unknown:
        raise ValueError(f"{name} does not take option(s) {sorted(unknown)}; "
                         f"it takes {sorted(accepted) or 'no options'}")
    chunks = options.get("chunks", 1)
    if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > 0:
        # (a bad chunks is the generator's to refuse: each says what it takes)
        at_most("ranks × chunks (stages)", ranks * chunks, MAX_STAGES)
        # Every stage runs a forward and a backward (up to three actions) per microbatch.
        at_most("ranks × chunks × microbatches", ranks * chunks * microbatches,
                MAX_ACTIONS // 3, "the schedule would hold too many actions")
    return generator(ranks=ranks, microbatches=microbatches, **options)
