"""Argument checks shared by the public functions: one rule, one wording, a ValueError that
names the parameter (never a deep torch error later). Booleans are not numbers here."""
from __future__ import annotations

import math


def integer(name: str, value) -> int:
    """`value` if it is an int (seeds, for example); else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def positive_int(name: str, value) -> int:
    """`value` if it is an int >= 1; else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def positive_number(name: str, value, what: str = "number") -> float:
    """`value` as a float if it is a finite number > 0; else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive {what}, got {value!r}")
    return float(value)
