"""Issue 9, points 1-3: the rendezvous stays on loopback, workers never outlive their parent,
and a script that cannot start workers says why, fast. Each test starts few processes."""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import pipelab as pl

pytestmark = pytest.mark.timeout(300)     # a loaded 2-core machine starts torch slowly
REPO = Path(__file__).resolve().parent.parent
CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)


# --- 1. loopback only ---------------------------------------------------------------------------
def _address(hex_addr: str) -> ipaddress._BaseAddress:
    """An address from /proc/net/tcp{,6}: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def sockets_of(pid: int) -> list[tuple[str, int, str]]:
    """(local address, port, state) of every TCP socket process `pid` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                addr, port = fields[1].split(":")
                out.append((str(_address(addr)), int(port, 16),
                            "LISTEN" if fields[3] == "0A" else fields[3]))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_no_socket_of_a_live_cluster_leaves_loopback() -> None:
    with pl.LocalCluster(ranks=2) as cluster:
        cluster.run(pl.schedule("1f1b", ranks=2, microbatches=2), model=CFG)
        seen = {pid: sockets_of(pid) for pid in [os.getpid()] + cluster.pids}
        assert any(seen[pid] for pid in cluster.pids), "found no socket at all: test is broken"
        outside = {pid: [s for s in socks if not is_loopback(s[0])] for pid, socks in seen.items()}
        assert not any(outside.values()), f"sockets beyond loopback: {outside}"


def test_the_check_recognises_an_open_socket() -> None:
    """The helper itself: a socket bound to every interface is seen as such."""
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::", 0))
        s.listen()
        mine = [x for x in sockets_of(os.getpid()) if x[1] == s.getsockname()[1]]
        assert mine and not is_loopback(mine[0][0]) and mine[0][2] == "LISTEN"


# --- 2. workers die with their parent ----------------------------------------------------------
PARENT = textwrap.dedent('''
    import os, signal, sys
    import multiprocessing.context as mpc
    import pipelab as pl

    def die_after_start(n):
        """SIGKILL this process right after the n-th worker process is started."""
        start, count = mpc.SpawnProcess.start, [0]
        def patched(self):
            start(self)
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        mpc.SpawnProcess.start = patched

    if __name__ == "__main__":
        mode = sys.argv[1]
        if mode.startswith("after-spawn-"):
            die_after_start(int(mode.rsplit("-", 1)[1]))
        print("go", flush=True)
        cfg = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8)
        sched = pl.schedule("gpipe", ranks=3, microbatches=24)
        with pl.LocalCluster(ranks=3, timeout=120) as cluster:
            print("started", flush=True)
            while True:
                cluster.run(sched, model=cfg, steps=5, check=False, progress=False)
                print("ran", flush=True)
''')


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds `tag` (the parent's children inherit it), except
    multiprocessing's resource tracker, which leaves by itself when its pipe closes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in environ and state != "Z" and b"resource_tracker" not in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("mode, wait_for, delay", [
    ("after-spawn-1", None, 0.0),         # killed between spawning rank 0 and rank 1
    ("after-spawn-3", None, 0.0),         # all spawned, none has joined the group
    ("startup", "go", 1.0),               # while the workers import and meet
    ("idle", "started", 0.0),             # a started cluster, between runs
    ("running", "ran", 0.2),              # in the middle of a run
])
def test_no_worker_outlives_a_killed_parent(tmp_path, mode, wait_for, delay) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    tag = f"PIPELAB_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1], "TMPDIR": str(tmp_path),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # TMPDIR: the rendezvous directory a killed parent cannot remove is left in tmp_path.
    parent = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        if wait_for is not None:
            for line in parent.stdout:
                if line.strip() == wait_for:
                    break
            time.sleep(delay)
            assert parent.poll() is None, "the parent ended by itself"
            parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=240)
        assert parent.returncode == -signal.SIGKILL
        killed = time.monotonic()
        left = tagged(tag)
        while left and time.monotonic() - killed < 5.0:
            time.sleep(0.1)
            left = tagged(tag)
        assert not left, f"worker processes {left} outlived their parent by 5 s ({mode})"
    finally:
        parent.kill()
        parent.wait()
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)


# --- 3. start-up failures say why --------------------------------------------------------------
def _python(args, **kwargs) -> tuple[subprocess.CompletedProcess, float, str]:
    tag = uuid.uuid4().hex
    env = {**os.environ, "PIPELAB_TEST_TAG": tag,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    began = time.monotonic()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=180, **kwargs)
    return done, time.monotonic() - began, tag


USE = ("import pipelab as pl\n"
       "cluster = pl.LocalCluster(ranks=2)\n"
       "print(cluster.run(pl.schedule('1f1b', ranks=2, microbatches=2)).loss)\n")


def _one_paragraph(stderr: str) -> str:
    last = stderr.strip().splitlines()[-1]
    assert len(stderr.strip().splitlines()) < 40, stderr        # not 136 lines of tracebacks
    assert "StartupError" in last, stderr
    return last


def test_a_script_on_stdin_is_refused_before_spawning() -> None:
    done, took, tag = _python(["-"], input=USE)
    assert done.returncode != 0
    last = _one_paragraph(done.stderr)
    assert "<stdin>" in last and "Save the script to a file" in last
    assert not tagged(tag)


@pytest.mark.parametrize("body", [USE, "def main():\n" + textwrap.indent(USE, "    ") + "main()\n"])
def test_a_script_without_the_main_guard_is_refused_before_spawning(tmp_path, body) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(body)
    done, took, tag = _python([str(script)])
    assert done.returncode != 0
    last = _one_paragraph(done.stderr)
    assert 'if __name__ == "__main__":' in last and "line " in last
    assert not tagged(tag)


def test_a_guarded_script_starts(tmp_path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text("import pipelab as pl\nif __name__ == '__main__':\n"
                      + textwrap.indent(USE.split("\n", 1)[1], "    "))
    done, _, _ = _python([str(script)])
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) > 0


def test_a_worker_that_fails_while_starting_gives_its_reason(tmp_path) -> None:
    """Past the parent's own check (here switched off), the worker re-running the unguarded
    script refuses to spawn more workers and the parent shows the worker's reason."""
    script = tmp_path / "sneaky.py"
    script.write_text("import pipelab as pl\n"
                      "import pipelab.runtime.pool as pool\n"
                      "if __name__ == '__main__':\n"
                      "    pool.check_can_spawn = lambda: None\n" + USE.split("\n", 1)[1])
    done, took, tag = _python([str(script)])
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "WorkerError" in last and "while starting: the main script creates a LocalCluster" \
        in last, done.stderr
    assert not tagged(tag)


def test_a_package_main_is_not_refused(tmp_path) -> None:
    """`python -m package`: spawn does not re-import a package's __main__, so no guard is needed."""
    (tmp_path / "pkgx").mkdir()
    (tmp_path / "pkgx" / "__init__.py").write_text("")
    (tmp_path / "pkgx" / "__main__.py").write_text(USE + "cluster.close()\n")
    done, _, _ = _python(["-m", "pkgx"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
