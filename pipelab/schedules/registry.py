"""Schedule generators by name: `schedule("1f1b", ranks=4, microbatches=8)`."""
from __future__ import annotations

import inspect
from typing import Callable

from ..checks import positive_int
from .gcpause import without_gc

SCHEDULES: dict[str, Callable] = {}


def register(name: str) -> Callable:
    """Decorator: make a generator available as `schedule(name, ...)`."""
    def add(generator: Callable) -> Callable:
        SCHEDULES[name] = generator = without_gc(generator)
        return generator
    return add


def schedule(name: str, ranks: int, microbatches: int, **options):
    """Build, validate and return the named schedule."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; registered schedules: {', '.join(SCHEDULES)}")
    positive_int("ranks", ranks)
    positive_int("microbatches", microbatches)
    generator = SCHEDULES[name]
    accepted = set(inspect.signature(generator).parameters) - {"ranks", "microbatches"}
    unknown = set(options) - accepted
    if unknown:
        raise ValueError(f"{name} does not take option(s) {sorted(unknown)}; "
                         f"it takes {sorted(accepted) or 'no options'}")
    return generator(ranks=ranks, microbatches=microbatches, **options).validate()
