"""The worker process: join the gloo group once, then run commands until told to stop.

Lives in the installed package so the spawn start method can import it from a notebook kernel
(a function defined in a cell cannot be spawned). Messages are pickled by value
(`send_bytes(pickle.dumps(...))`), which sidesteps torch.multiprocessing's shared-memory
tensor sharing: results are small and this keeps file descriptors out of the picture.
"""
from __future__ import annotations

import ctypes
import gc
import os
import pickle
import signal
import traceback

from .rendezvous import join_group
from .board import Board
from .calls import run_call
from .executor import run_rank, warm_up


def _die_with_parent() -> None:
    # If the parent is killed outright, take the worker down too (Linux only; best effort).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pin(core: int | None) -> int | None:
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, {core})
        return core
    except OSError:
        return None


def worker_main(rank: int, world: int, rendezvous: str, conn, board_array, core: int | None,
                group_timeout: float, start_timeout: float = 120.0,
                parent_pid: int | None = None) -> None:
    """Entry point of one worker (rank `rank` of `world`); the group meets through the store in
    directory `rendezvous`. The spawn command line already arranged to die with `parent_pid`
    (rendezvous.die_with_parent); this repeats it in case it could not."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle
    _die_with_parent()
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(3)                                  # the parent died before that took effect
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"          # loopback only
    import torch

    torch.set_num_threads(1)
    pinned = _pin(core)

    def reply(*message) -> None:
        conn.send_bytes(pickle.dumps(message))

    try:
        join_group(rendezvous, rank, world, group_timeout, rendezvous_timeout=start_timeout)
        board = Board(board_array, world)
        warm_up()
        # Everything alive now (torch, the modules, the warm-up's leftovers) lives as long as
        # the worker: move it out of the collector's sight, so that a full collection, when
        # one falls inside a measured step, walks only what the step made (ms -> µs).
        gc.collect()
        gc.freeze()
    except BaseException:
        reply("error", rank, traceback.format_exc())
        return
    reply("ready", rank, os.getpid(), pinned)
    while True:
        try:
            command, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):                   # the parent went away
            break
        if command == "close":
            break
        try:
            if command == "call":                     # a function named by module path
                report = run_call(payload)
            else:
                report = run_rank(payload, rank, board,
                                  notify=lambda step, loss: reply("step", rank, step, loss))
            reply("done", rank, report)
        except BaseException:
            reply("error", rank, traceback.format_exc())
    conn.close()
    # No destroy_process_group: peers may already be gone, and exiting closes the sockets.
    os._exit(0)
