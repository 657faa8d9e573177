"""Waiting out an emulated link (`pl.Link`, sim/link.py) on the ranks: sleep, never spin.

A message or a collective posted under a link completes no earlier than the link's time for it
after it was posted. The data itself still moves over loopback (microseconds); what the link
adds is a wait until that deadline, spent in `time.sleep`: the rank's core is free for the
others, and the rank's thread CPU time (what the replay charges an action) does not grow.

* A point-to-point message carries its post time in a second, tiny message (a float64 on tag
  `STAMP_TAG + tag`): the receiver, once both arrived, sleeps until post time + α + bytes/β.
  A message that arrived while the receiver was computing costs it nothing more.
* A collective is posted together with a MAX all-reduce of its members' post times (on the
  same group, in the same order on every member): it completes once gloo has finished it and
  the last member's post time + the link's formula (ring all-reduce, all-to-all) has passed,
  as the simulator starts a collective when its last member reaches it.

Post times are `time.perf_counter()`, the system-wide monotonic clock: comparable between the
processes of one machine (the runtime's timelines already rely on it).
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

STAMP_TAG = 1 << 30        # message tags from the plan are small: stamps live far above them


def sleep_until(deadline: float) -> None:
    """Sleep (the core is given up) until `perf_counter()` reaches `deadline`."""
    left = deadline - time.perf_counter()
    while left > 0:            # sleep may return early on a signal: go back to it
        time.sleep(left)
        left = deadline - time.perf_counter()


def now_stamp() -> torch.Tensor:
    """This moment, as the one-element float64 tensor a stamp message carries."""
    return torch.tensor([time.perf_counter()], dtype=torch.float64)


class DelayedMessage:
    """A posted receive under a link: `wait()` returns once the data and its post time have
    arrived and post time + `seconds` has passed."""

    def __init__(self, handle, stamp_handle, stamp: torch.Tensor, seconds: float):
        self.handle, self.stamp_handle = handle, stamp_handle
        self.stamp, self.seconds = stamp, seconds

    def wait(self) -> None:
        self.handle.wait()
        self.stamp_handle.wait()
        sleep_until(self.stamp.item() + self.seconds)


class DelayedCollective:
    """A collective posted under a link (see the module docstring). `post()` launches it
    asynchronously on `group` and returns its handle; `seconds` is the link's time for it."""

    def __init__(self, post: Callable[[], object], group, seconds: float):
        self.latest = now_stamp()          # becomes the members' latest post time
        self.clock = dist.all_reduce(self.latest, op=dist.ReduceOp.MAX, group=group,
                                     async_op=True)
        self.handle = post()
        self.seconds = seconds

    def is_completed(self) -> bool:
        """Whether `wait()` would return at once (gloo finished, and the deadline passed)."""
        if not (self.clock.is_completed() and self.handle.is_completed()):
            return False
        return time.perf_counter() >= self.latest.item() + self.seconds

    def wait(self) -> None:
        self.clock.wait()
        self.handle.wait()
        sleep_until(self.latest.item() + self.seconds)


def collective(post: Callable[[], object], group, seconds: float, link) -> object:
    """`post()` (an async collective on `group`) as it runs: on the link when there is one
    (a DelayedCollective), else the bare gloo handle. Either has `wait()` and `is_completed()`."""
    if link is None:
        return post()
    return DelayedCollective(post, group, seconds)
