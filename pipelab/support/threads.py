"""One torch thread for the small reference computations a process does on its own."""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_thread():
    """Run the block with one intra-op torch thread, then restore the setting.

    Chapter 11's one-process emulations (run in the parent after an asynchronous run) and the
    layer-cost probe multiply tiny matrices: a second thread gains nothing there, and on a machine
    whose cores the workers (or other users) already fill, every product waits for it to be
    scheduled. Measured on the 2-core machine at load 10–15: a 2BW run's check took 1–4 s with
    two threads, 0.2–0.3 s with one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
