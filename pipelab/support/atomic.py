"""Files written whole or not at all.

Writing a file in place truncates it first: a full disk, an exception half-way through or a
SIGKILL then leaves a cut-off file where a good one was (a 65,536-byte piece of a JSON trace, a
0-byte CSV). Every file the package writes goes through `replacing` instead: the content is
written to a temporary file beside the target (same directory, so same file system), flushed to
disk, and renamed over the target with os.replace, which is atomic on POSIX and Windows. A
reader sees the old file or the new one, never a mix; a failure removes the temporary file.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def check_target(path: str | Path, name: str = "path") -> Path:
    """`path` as a Path if a file can be written there: its folder exists and is writable and
    it is not itself a folder; else ValueError naming `name` (before any work is done)."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{name} {str(target)!r} is a directory: give a file name, e.g. "
                         f"{str(target / 'run.json')!r}")
    folder = target.resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ValueError(f"{name} {str(target)!r}: the folder {str(folder)!r} does not exist or "
                         f"is not writable")
    return target


@contextmanager
def replacing(path: str | Path, mode: str = "w", **open_args) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing; on a clean exit it replaces `path`
    (keeping an existing file's permissions), on an exception it is removed and `path` is left
    as it was."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path} is a directory")
    target = Path(os.path.realpath(path))     # through a symbolic link: the link stays
    handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(temp, os.stat(target).st_mode & 0o7777)
        except FileNotFoundError:          # a new file: the usual mode, as open() would give
            os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def write_text(path: str | Path, text: str) -> Path:
    """Path(path).write_text(text), atomically."""
    with replacing(path, encoding="utf-8") as f:
        f.write(text)
    return Path(path)


def _umask() -> int:
    # (read by setting it: there is no other portable way; it is restored at once)
    mask = os.umask(0)
    os.umask(mask)
    return mask
