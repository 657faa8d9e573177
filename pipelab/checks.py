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


def two_sizes(name: str, sizes) -> tuple[int, int]:
    """`sizes` if it is two positive ints, the second larger (two points to fit a line through);
    else ValueError naming `name`."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) != 2:
        raise ValueError(f"{name} must be two sizes, the second larger, e.g. (1, 4), got {sizes!r}")
    small, large = positive_int(f"{name}[0]", sizes[0]), positive_int(f"{name}[1]", sizes[1])
    if large <= small:
        raise ValueError(f"{name} must be two sizes, the second larger, got {sizes!r}")
    return small, large


def positive_number(name: str, value, what: str = "number") -> float:
    """`value` as a float if it is a finite number > 0; else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive {what}, got {value!r}")
    return float(value)


def positive_ints(name: str, values, example: str = "(2, 4)") -> tuple[int, ...]:
    """`values` as a tuple if it is a non-empty list, tuple or range of ints >= 1 (a bare int or
    a string is refused: the parameter is a set of candidates); else ValueError naming `name`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise ValueError(f"{name} must be a list or tuple of positive integers, e.g. {example}, "
                         f"got {_short(values)}")
    if not values:
        raise ValueError(f"{name} must list at least one value, e.g. {example}, got {values!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must hold positive integers only, e.g. {example}, got "
                             f"{_short(value)} in {_short(values)}")
    return tuple(values)


def names(name: str, values, example: str) -> tuple[str, ...]:
    """`values` as a tuple of strings if it is a non-empty list or tuple of them (one string
    alone is refused: iterating it would read each letter as a name)."""
    if isinstance(values, str):
        raise ValueError(f"{name} must be a list or tuple of names, e.g. {example}, got the "
                         f"single string {values!r}: write [{values!r}]")
    if not isinstance(values, (list, tuple)) or not values \
            or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name} must be a non-empty list or tuple of names, e.g. {example}, "
                         f"got {_short(values)}")
    return tuple(values)


# Sizes beyond which a request is refused up front: far above anything a notebook or a test
# needs, far below what would exhaust memory or run for minutes before saying anything.
MAX_RANKS = 8192
MAX_STAGES = 65536
MAX_MICROBATCHES = 1_000_000
MAX_ACTIONS = 4_000_000          # compute actions in one schedule
MAX_LOCAL_RANKS = 256            # worker processes of one LocalCluster
SEED_RANGE = (-2**63, 2**64)     # what torch.Generator.manual_seed accepts: [low, high)
MAX_LAYERS = 100_000             # layers a partition or a cost table lists one by one
MAX_STEPS = 100_000              # training steps of one run: hours on two cores already


def at_most(name: str, value: int, limit: int, why: str = "") -> int:
    """`value` if it is <= `limit`; else ValueError naming `name` and the limit."""
    if value > limit:
        raise ValueError(f"{name}={_short(value)} is above the limit of {limit:,}"
                         + (f" ({why})" if why else ""))
    return value


def check_steps(value, name: str = "steps") -> int:
    """`value` if it is an int in 1..MAX_STEPS; else ValueError naming `name` and the limit."""
    return at_most(name, positive_int(name, value), MAX_STEPS,
                   "each step is a training step of the whole pipeline; run longer in several "
                   "runs")


def seed(name: str, value, low: int = SEED_RANGE[0], high: int = SEED_RANGE[1],
         why: str = "torch's generators take 64-bit seeds") -> int:
    """`value` if it is an integer in [low, high); else ValueError naming `name`."""
    integer(name, value)
    if not low <= value < high:
        raise ValueError(f"{name}={_short(value)} is out of range: it must be an integer in "
                         f"[{low}, {high}) ({why})")
    return value


def boolean(name: str, value) -> bool:
    """`value` if it is True or False (not "no", not 0); else ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {_short(value)}")
    return value


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
