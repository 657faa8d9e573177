"""The mesh axes the planner searches: pipeline (p), data (dp) and tensor (tp) degrees with
p × dp × tp = devices. Shared by both sources of costs (calibrated.py, shaped.py); what a
source adds is which tensor degrees its model allows and how many stages it can be cut into.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator


def divisors(n: int) -> list[int]:
    """The divisors of `n`, increasing."""
    return [d for d in range(1, n + 1) if n % d == 0]


def meshes(devices: int, batch_size: int, max_pipeline: int,
           tensor_ok: Callable[[int], bool]) -> Iterator[tuple[int, int, int]]:
    """(p, dp, tp) with p × dp × tp = devices, tp allowed by `tensor_ok`, p at most
    `max_pipeline`, and a batch that splits evenly over the dp replicas. By increasing tp,
    then p."""
    for tp in divisors(devices):
        if not tensor_ok(tp):
            continue
        for p in divisors(devices // tp):
            dp = devices // tp // p
            if p <= max_pipeline and batch_size % dp == 0:
                yield p, dp, tp
