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

`BOOT` is the spawn target. A spawned child imports the target's module before calling it, and
importing anything in pipelab imports torch (1-2 s, more on a loaded machine): a parent killed
in that window would leave the child behind. So the target is a function made from source by
`eval` in the child (pickled as a call to the builtin), which arranges to die with the parent
(PR_SET_PDEATHSIG) and checks the parent is still the one that spawned it *before* importing
pipelab. (A script's own top-level imports still run first, when spawn re-imports the main
module; the parent check then catches a parent that died meanwhile.)
"""
from __future__ import annotations

import os
import shutil
import tempfile
from datetime import timedelta

STORE_FILE = "store"
REPORT_FILE = "startup-error"        # a child that fails before it can use its pipe writes here
ENV_DIR = "PIPELAB_RENDEZVOUS_DIR"   # set for the children while they are spawned

_BOOT_SOURCE = '''
def boot(parent_pid, *args):
    import ctypes, os, signal
    try:   # PR_SET_PDEATHSIG = 1: the kernel kills this process when its parent dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:       # the parent died before the line above took effect
        os._exit(3)
    from pipelab.runtime.worker import worker_main
    worker_main(*args)
'''


def _make_boot():
    namespace: dict = {}
    exec(_BOOT_SOURCE, namespace)
    return namespace["boot"]


class _Boot:
    """Pickles as `eval(...)` of a tiny source, so that unpickling it imports nothing."""

    def __reduce__(self):
        return (eval, ("(lambda ns: (exec(%r, ns), ns['boot'])[1])({})" % _BOOT_SOURCE,))

    def __call__(self, *args):          # the same function, called in this process (tests)
        return _make_boot()(*args)


BOOT = _Boot()


def make_dir() -> str:
    """A fresh private directory for one pool's rendezvous file."""
    return tempfile.mkdtemp(prefix="pipelab-rdv-")


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
