"""Where the workers meet: a rendezvous that never leaves this machine, and a child that never
outlives its parent.

The rendezvous is a `torch.distributed.FileStore` in a private temporary directory (mode 0700),
not a TCP store. `init_process_group("gloo", init_method="tcp://127.0.0.1:P")` makes rank 0
listen on *every* interface (`*:P`, IPv4 and IPv6) for the cluster's whole life; a TCPStore
handed a socket bound to 127.0.0.1 (`master_listen_fd`) would stay on loopback but is still
open to every local user, and the port is chosen in the parent and bound in the child (another
process can take it in between). A file in a directory only the user can enter has neither
problem, needs no port, and works for any number of ranks. gloo's own point-to-point sockets
are kept on loopback by GLOO_SOCKET_IFNAME=lo.

A child that never outlives its parent: a spawned child first re-imports the parent's main
script (for a script, that usually imports pipelab and torch: seconds on a loaded machine),
then unpickles its target (importing pipelab), and only then runs worker code. A parent killed
in that window left a worker waiting for the rendezvous for > 700 s. So `die_with_parent` puts
two statements in front of the child's own command line (`python -c "..."`): arrange to be
killed when the parent dies (PR_SET_PDEATHSIG), then check the parent is still the process
that spawned it (it may have died before the first statement ran). Nothing else runs first.
The worker repeats both once it runs (`worker.py`), in case the command line could not be
changed, and the rendezvous is bounded in time.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from datetime import timedelta

PREFIX = "pipelab-rdv-"
_STALE = re.compile(re.escape(PREFIX) + r"(\d+)-\w+")
STORE_FILE = "store"
REPORT_FILE = "startup-error"        # a child that fails before it can use its pipe writes here
ENV_DIR = "PIPELAB_RENDEZVOUS_DIR"   # set for the children while they are spawned
INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"

_PACT = ("import ctypes, os; ctypes.CDLL(None, use_errno=True).prctl(1, 9); "   # 1: PDEATHSIG
         "os.getppid() == {pid} or os._exit(3); ")                                # 9: SIGKILL


@contextmanager
def die_with_parent():
    """While active, processes spawned by multiprocessing (spawn start method) begin by
    arranging to die with this process (Linux; elsewhere, or if Python builds the command line
    differently, the command line is left alone and the worker arranges it later)."""
    from multiprocessing import spawn
    original = spawn.get_command_line
    pact = _PACT.format(pid=os.getpid())

    def with_pact(**kwargs):
        cmd = original(**kwargs)
        if sys.platform.startswith("linux") and "-c" in cmd[:-1]:
            at = cmd.index("-c") + 1
            cmd = cmd[:at] + [pact + cmd[at]] + cmd[at + 1:]
        return cmd

    spawn.get_command_line = with_pact
    try:
        yield
    finally:
        spawn.get_command_line = original


@contextmanager
def spawning(directory: str):
    """While workers for the rendezvous in `directory` are spawned: they die with this process
    from their first statement, and find `directory` in their environment (ENV_DIR) to leave a
    reason there if they fail before their pipe works."""
    # torch writes a compile cache (TMPDIR/torchinductor_<user>) the first time anything imports
    # torch._dynamo, which AdamW's step does: a worker keeps it in the rendezvous directory,
    # removed with the pool (or by the next start's sweep), unless the user chose a place.
    names = (ENV_DIR, INDUCTOR_DIR)
    old = {name: os.environ.get(name) for name in names}
    os.environ[ENV_DIR] = directory
    os.environ.setdefault(INDUCTOR_DIR, os.path.join(directory, "torchinductor"))
    try:
        with die_with_parent():
            yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def make_dir() -> str:
    """A fresh private directory for one pool's rendezvous file, named after this process
    (`pipelab-rdv-<pid>-...`) so that a later start can tell it is stale; stale ones are
    removed first (see `sweep`)."""
    sweep()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def sweep(folder: str | None = None) -> list[str]:
    """Remove this user's rendezvous directories whose creating process is gone; return them.

    A pool removes its directory when it closes, and at exit; a parent killed outright
    (SIGKILL, OOM) cannot, and its workers die with it (PR_SET_PDEATHSIG), so nobody is left to
    clean: the next start does it. The directory also holds the workers' torch compile cache
    (`spawning`), which therefore goes with it."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        match = _STALE.fullmatch(entry)
        path = os.path.join(folder, entry)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue                      # another user's: not ours to judge
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                           # exists, owned by someone else
        return True
    return True


def remove_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def join_group(directory: str, rank: int, world: int, group_timeout: float,
               rendezvous_timeout: float) -> None:
    """init_process_group over a FileStore in `directory`. The rendezvous gives up after
    `rendezvous_timeout` seconds: a peer that never comes must not keep this process waiting
    (the store's own timeout is not enough: torch may wait on it with the group's timeout)."""
    import threading
    import torch.distributed as dist

    def give_up() -> None:
        report_startup_error(f"rank {rank}: the rendezvous did not complete within "
                             f"{rendezvous_timeout:g} s")
        os._exit(4)

    timer = threading.Timer(rendezvous_timeout, give_up)
    timer.daemon = True
    timer.start()
    try:
        store = dist.FileStore(os.path.join(directory, STORE_FILE), world)
        store.set_timeout(timedelta(seconds=rendezvous_timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=group_timeout))
    finally:
        timer.cancel()


def report_startup_error(text: str) -> None:
    """From a child that fails before its pipe works: leave a line for the parent to show."""
    directory = os.environ.get(ENV_DIR)
    if directory and os.path.isdir(directory):
        try:
            with open(os.path.join(directory, REPORT_FILE), "a") as f:
                f.write(text.rstrip() + "\n")
        except OSError:
            pass


def read_startup_error(directory: str | None) -> str:
    if not directory:
        return ""
    try:
        with open(os.path.join(directory, REPORT_FILE)) as f:
            return f.read().strip()
    except OSError:
        return ""
