"""Worker processes: start, talk to, and always reap.

Spawned (not forked: forking a process that has used OpenMP can hang the child), one thread
each, pinned round-robin to the cores this process may use, joined in a gloo group on
loopback through a private rendezvous directory (rendezvous.py). Each worker has its own pipe,
so the parent can wait on every pipe and every process sentinel at once and notice a result,
an error or a death immediately.
"""
from __future__ import annotations

import os
import pickle
import time
from multiprocessing.connection import wait

from . import rendezvous
from .board import POLL, Board
from .errors import WorkerError
from .startup import check_can_spawn, startup_death
from .worker import worker_main


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return []


class WorkerPool:
    """`ranks` live workers sharing a progress board. Not reusable after `kill()`/`close()`."""

    def __init__(self, ranks: int, pin: bool = True, group_timeout: float = 600.0,
                 start_timeout: float = 120.0):
        import torch.multiprocessing as tmp
        check_can_spawn()
        ctx = tmp.get_context("spawn")
        self.ranks = ranks
        self.board = Board.create(ctx, ranks)
        self.board.reset()
        cores = usable_cores() if pin else []
        self.procs, self.conns, self.pids, self.cores = [], [], [], [None] * ranks
        self.rendezvous = rendezvous.make_dir()
        try:
            with rendezvous.spawning(self.rendezvous):
                for rank in range(ranks):
                    parent_end, child_end = ctx.Pipe(duplex=True)
                    core = cores[rank % len(cores)] if cores else None
                    proc = ctx.Process(target=worker_main, name=f"pipelab-rank{rank}",
                                       daemon=True,
                                       args=(rank, ranks, self.rendezvous, child_end,
                                             self.board.array, core, group_timeout,
                                             start_timeout, os.getpid()))
                    proc.start()
                    child_end.close()
                    self.procs.append(proc)
                    self.conns.append(parent_end)
            self.pids = [p.pid for p in self.procs]
            self._wait_ready(start_timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, start_timeout: float) -> None:
        deadline = time.monotonic() + start_timeout
        waiting = set(range(self.ranks))
        while waiting:
            for rank, message in self.receive(waiting, timeout=POLL):
                if message[0] == "ready":
                    _, _, _pid, core = message
                    self.cores[rank] = core
                    waiting.discard(rank)
                elif message[0] == "error":
                    raise WorkerError(f"worker process {rank} failed to start:\n{message[2]}", rank,
                                      traceback=message[2])
            self._check_started()
            if time.monotonic() > deadline:
                raise WorkerError(f"worker processes {sorted(waiting)} did not start within "
                                  f"{start_timeout:g} s")

    def _check_started(self) -> None:
        """check_alive while starting: a death then gets the worker's own reason when known."""
        try:
            self.check_alive()
        except WorkerError as err:
            raise WorkerError(startup_death(str(err), rendezvous.read_startup_error(
                self.rendezvous)), err.rank, exitcode=err.exitcode) from None

    # --- messages -------------------------------------------------------------------------------
    def send(self, rank: int, command: str, payload=None) -> None:
        self.conns[rank].send_bytes(pickle.dumps((command, payload)))

    def broadcast(self, command: str, payload=None) -> None:
        data = pickle.dumps((command, payload))     # pickled once for every rank
        for conn in self.conns:
            conn.send_bytes(data)

    def receive(self, ranks, timeout: float) -> list[tuple[int, tuple]]:
        """Messages from `ranks` that arrive within `timeout` (returns early on a death: the
        caller reads the messages first, then calls `check_alive`)."""
        conns = {self.conns[r]: r for r in ranks}
        sentinels = {self.procs[r].sentinel: r for r in range(self.ranks)}
        out = []
        for ready in wait(list(conns) + list(sentinels), timeout):
            if ready in conns:
                try:
                    out.append((conns[ready], pickle.loads(ready.recv_bytes())))
                except (EOFError, OSError):
                    pass                      # a dead worker: the caller's check_alive reports it
        return out

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                raise WorkerError(_death(rank, proc.exitcode), rank, exitcode=proc.exitcode)

    # --- lifecycle ------------------------------------------------------------------------------
    def alive(self) -> bool:
        return bool(self.procs) and all(p.exitcode is None for p in self.procs)

    def close(self, grace: float = 2.0) -> None:
        """Ask every worker to leave, then kill whatever has not left after `grace` seconds."""
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(("close", None)))
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """SIGKILL every worker and reap it: a worker blocked inside gloo ignores anything gentler."""
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join(5.0)
            if proc.exitcode is not None:
                proc.close()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        rendezvous.remove_dir(getattr(self, "rendezvous", None))


def death(code: int) -> str:
    """How a worker process ended: "was killed by signal 9", "exited with code 1"."""
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _death(rank: int, code: int) -> str:
    # The pool knows processes, not their place in a mesh: the cluster names that (cluster._who).
    return f"worker process {rank} died: it {death(code)}"
