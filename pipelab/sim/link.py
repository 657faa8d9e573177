"""An emulated network link: what a message or a collective costs at latency α and bandwidth β.

    link = pl.Link(latency=0.02, bandwidth=1e9)          # 20 ms, 1 GB/s
    cluster.run(sched, model=cfg, link=link)             # every transfer waits as on that link
    link.transfer_time(nbytes)                           # α + bytes/β, one point-to-point message

On two CPU cores, loopback messages take ~50 µs: schedules that differ in how they hide
communication look the same. With a link, the runtime holds every message and every collective
until the time this model gives has passed since it was posted, sleeping (no core is used, so
the compute of the other ranks is not slowed), and the simulator prices them with the same
formulas, so a measured run and its simulation can be compared.

The collective formulas are the usual α–β models (Thakur, Rabenseifner & Gropp 2005):
a ring all-reduce is a reduce-scatter then an all-gather, 2(n−1) rounds each sending 1/n of
the buffer, so 2(n−1)·α + 2(n−1)/n · bytes/β; a pairwise all-to-all is n−1 rounds, each process
sending the (n−1)/n of its buffer bound for the others: (n−1)·α + (n−1)/n · bytes/β.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..schedules.reductions import allreduce_time


MAX_LATENCY = 3600.0       # seconds: an hour per message is no network a run can wait out
MIN_BANDWIDTH = 1.0        # bytes/s


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Link:
    """A point-to-point link: `latency` seconds (α) per message, `bandwidth` bytes/s (β)."""
    latency: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not (_number(self.latency) and math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"Link latency must be a finite number of seconds >= 0, "
                             f"got {self.latency!r}")
        if not (_number(self.bandwidth) and self.bandwidth > 0 and not math.isnan(self.bandwidth)):
            raise ValueError(f"Link bandwidth must be a number of bytes/s > 0 (math.inf for "
                             f"latency only), got {self.bandwidth!r}")
        if self.latency > MAX_LATENCY or self.bandwidth < MIN_BANDWIDTH:
            raise ValueError(f"Link(latency={self.latency!r}, bandwidth={self.bandwidth!r}): "
                             f"latency must be at most {MAX_LATENCY:g} s and bandwidth at least "
                             f"{MIN_BANDWIDTH:g} byte/s (beyond them a message outlasts any run, "
                             f"and the collectives' times overflow)")
        object.__setattr__(self, "latency", float(self.latency))
        object.__setattr__(self, "bandwidth", float(self.bandwidth))

    def transfer_time(self, nbytes: float) -> float:
        """Seconds one message of `nbytes` takes: α + bytes/β."""
        return self.latency + nbytes / self.bandwidth

    def allreduce_time(self, nbytes: float, processes: int) -> float:
        """Seconds of a ring all-reduce of `nbytes` over `processes`:
        2(n−1)·α + 2(n−1)/n · bytes/β (0 for one process)."""
        return allreduce_time(nbytes, processes, self.bandwidth, self.latency)

    def all_to_all_time(self, nbytes: float, processes: int) -> float:
        """Seconds of a pairwise all-to-all where each process sends a buffer of `nbytes`
        (its own share included): (n−1)·α + (n−1)/n · bytes/β (0 for one process)."""
        if processes <= 1:
            return 0.0
        return (processes - 1) * (self.latency + nbytes / processes / self.bandwidth)

    def __str__(self) -> str:
        return f"link α={self.latency * 1e3:g} ms, β={self.bandwidth / 1e9:g} GB/s"


def check_link_time(link: Link, nbytes: int, processes: int, timeout: float) -> None:
    """ValueError, before any worker starts, if one message of `nbytes` (or a gradient
    all-reduce of as many over `processes`) would wait on `link` longer than the run's
    no-progress `timeout`: the run could only time out."""
    worst = max(link.transfer_time(nbytes), link.allreduce_time(nbytes, processes))
    if not worst < timeout:
        raise ValueError(f"link={link}: one message of {nbytes:,} bytes waits {worst:.3g} s on "
                         f"it, longer than the run's timeout of {timeout:g} s, so the run could "
                         f"only time out; raise timeout= or use a faster link")


def check_link(value) -> Link | None:
    """`value` if it is None or a pl.Link; else ValueError naming the parameter."""
    if value is None or isinstance(value, Link):
        return value
    raise ValueError(f"link must be a pl.Link(latency=seconds, bandwidth=bytes_per_s) or None, "
                     f"got {type(value).__name__} {value!r}")
