"""Run a function named by module path on every worker: the runtime half of plugins.

    results = cluster.call("pipelab.bench.torch_side:run_step", job)   # one result per rank

Workers are spawned processes: they can import a function from an installed or importable
module, never from `__main__` (a notebook cell or the script being run), whose objects do not
exist in the worker. So a target is resolved by name in the parent first and refused there,
with a message that says what to do, before any worker is asked to do anything: a bad name must
not leave some ranks waiting in a collective for ranks that failed to import.

Inside the call, torch.distributed is initialised (the pool's gloo group): the function finds
its rank with `dist.get_rank()` and may use any collective or point-to-point operation, as long
as every rank's call makes the matching ones.
"""
from __future__ import annotations

import pickle
import time
from typing import Callable

from ..model.importable import function_name, resolve as resolve_name
from .board import POLL
from .errors import PipelineTimeout, WorkerError
from ..support import noise     # read at call time: a test can stand in for the load reading
from .result import RunResult


def target_name(target: "str | Callable") -> str:
    """'package.module:function' for `target` (a name or a function), or ValueError saying why
    the workers could not run it."""
    return function_name(target, "cluster.call")


def resolve(name: str) -> Callable:
    """Import `module:qualname` and return the function (ValueError if it does not exist)."""
    return resolve_name(name, "cluster.call")


def run_call(message) -> object:
    """In a worker: run the named function with the shipped arguments."""
    name, args, kwargs = message
    return resolve(name)(*args, **kwargs)


def pack_call(name: str, args: tuple, kwargs: dict) -> bytes:
    """The command every worker receives (pickled once; unpicklable arguments fail here, in the
    parent, before any worker is asked anything)."""
    try:
        return pickle.dumps(("call", (name, args, kwargs)))
    except Exception as err:
        raise ValueError(f"cluster.call: the arguments of {name} cannot be pickled for the "
                         f"workers: {err}") from None


class CallResults(list):
    """The results of `cluster.call`, one per rank in rank order (a list, equal to a plain one),
    with the machine's load average when the call was sent and when it came back: whatever a
    call measures means little on a shared machine without it."""

    def __init__(self, results, load: tuple[float, float]):
        super().__init__(results)
        self.load = load

    @property
    def load_line(self) -> str:
        """"measured at load average 2.31 → 2.40 on 2 cores", worded as a run's."""
        return RunResult.load_line.fget(self)

    def __repr__(self) -> str:
        return f"{super().__repr__()}\n{self.load_line}"


def call_all(pool, name: str, data: bytes, timeout: float,
             check_deaths: Callable[[float], None]) -> CallResults:
    """Send the packed call to every worker of `pool`; return the results in rank order, with
    the load they ran at.

    Raises WorkerError (an exception in a worker, or a death) or PipelineTimeout (no answer from
    every rank within `timeout` seconds); the caller then discards the workers.
    """
    load_before = noise.load_average()
    for conn in pool.conns:
        conn.send_bytes(data)
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    while len(results) < pool.ranks:
        waiting = [r for r in range(pool.ranks) if r not in results]
        for rank, message in pool.receive(waiting, timeout=POLL):
            if message[0] == "done":
                results[rank] = message[2]
            elif message[0] == "error":
                check_deaths(0.5)     # a dead peer makes survivors fail: report the death
                text = message[2]
                last = text.strip().splitlines()[-1] if text.strip() else "an exception"
                raise WorkerError(f"rank {rank} raised {last} in {name}.\nWorker traceback:\n"
                                  f"{text}", rank, traceback=text)
        check_deaths(0.0)
        if time.monotonic() > deadline:
            raise PipelineTimeout(f"cluster.call: {name} did not return on ranks {waiting} "
                                  f"within {timeout:g} s; the workers were stopped and the next "
                                  f"run starts fresh ones", waiting[0], waited=timeout)
    return CallResults([results[r] for r in range(pool.ranks)], (load_before, noise.load_average()))
