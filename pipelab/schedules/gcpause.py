"""Pause Python's cyclic garbage collector around bulk work on big schedules.

A 64-rank, 1024-microbatch schedule is ~10^5 small tuples; while they are being built the
collector rescans them again and again, which costs several times the work itself. Nothing
built here forms reference cycles, so pausing it is safe.
"""
from __future__ import annotations

import functools
import gc
from contextlib import contextmanager


@contextmanager
def paused_gc():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn):
    """Decorator form of `paused_gc`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with paused_gc():
            return fn(*args, **kwargs)
    return wrapper
