"""Why workers could not start, said before spawning them where possible.

Spawned workers re-import the parent's main script (Python's spawn start method does that so
that functions defined there can be found). Two scripts cannot work that way, and without
these checks both ended in "rank 0 died: the worker process exited with code 1" after a long
traceback: a script fed on stdin (there is no file to re-import), and a script that creates
the cluster at its top level, outside `if __name__ == "__main__":` (each worker would run the
script again and try to start workers of its own).
"""
from __future__ import annotations

import ast
import multiprocessing
import sys

from .rendezvous import report_startup_error

GUARD_HINT = ('put the code that starts the cluster under `if __name__ == "__main__":` '
              '(workers are spawned processes that re-import the main script; the guard keeps '
              'them from running it)')


class StartupError(RuntimeError):
    """The worker processes cannot be started from here; the message says what to do."""


def inside_spawn_bootstrap() -> bool:
    """True in a spawned child while it re-imports the parent's main script."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def check_can_spawn() -> None:
    """Raise StartupError if workers started now would fail to start (see the module doc)."""
    if inside_spawn_bootstrap():
        # We are a worker re-running an unguarded script: refuse, and leave the reason where
        # the parent finds it (rendezvous.read_startup_error), instead of spawning recursively.
        message = ("the main script creates a LocalCluster when a worker re-imports it: "
                   + GUARD_HINT)
        report_startup_error(message)
        raise StartupError(message)
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return              # python -m package: spawn does not re-import a package's __main__
    path = getattr(main, "__file__", None)
    if path is None:
        return              # a notebook, an interactive session, python -c: nothing re-imported
    if path.startswith("<") and path.endswith(">"):     # "<stdin>", "<string>"
        raise StartupError(
            f"pipelab cannot start worker processes from a script read from {path}: each "
            f"worker re-imports the main script, and there is no file to read. Save the script "
            f"to a file and run `python script.py` (with the code that starts the cluster under "
            f'`if __name__ == "__main__":`), or use `python -c` or a notebook')
    line = _unguarded_call_line(main, path)
    if line is not None:
        raise StartupError(f"{path}, line {line}, starts a LocalCluster at the top level of the "
                           f"main script, so every worker would start it again: {GUARD_HINT}")


def startup_death(death: str, reason: str) -> str:
    """The message for a worker that died before it was ready: its own first error line when it
    left one (rendezvous.read_startup_error), else where to look."""
    if reason:
        return f"{death} while starting: {reason.splitlines()[0]}"
    return (f"{death} while starting, before it could report an error (its traceback, if any, "
            f"is on this process's stderr). A worker first re-imports the main script: does it "
            f"run at the top level something that fails or starts workers there, outside "
            f'`if __name__ == "__main__":`?')


def _unguarded_call_line(main, path: str) -> int | None:
    """The line of the main script's top-level code that is starting workers, if that line is
    not under an `if __name__ == "__main__":` (None when unknown or guarded)."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__
                                     and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None          # not called from the main script's top-level code
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return None if _is_main_guard(node) else line
    return None


def _is_main_guard(node) -> bool:
    if not isinstance(node, ast.If):
        return False
    names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
    return "__name__" in names
