"""Files written whole or not at all.

Writing a file in place truncates it first: a full disk, an exception half-way through or a
SIGKILL then leaves a cut-off file where a good one was (a 65,536-byte piece of a JSON trace, a
0-byte CSV). Every file the package writes goes through `replacing` instead: the content is
written to a temporary file beside the target (same directory, so same file system), flushed to
disk, and renamed over the target with os.replace, which is atomic on POSIX and Windows. A
reader sees the old file or the new one, never a mix; a failure removes the temporary file.
"""
from __future__ import annotations

import errno
import os
import stat
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
    target = _through_link(Path(path))
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                        dir=target.parent)
    except OSError as err:             # name the file asked for, not the temporary one
        raise _naming(err, path) from None
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
    except BaseException as err:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(err, OSError) and err.filename in (temp, None):
            raise _naming(err, path) from None
        raise


def _naming(err: OSError, path) -> OSError:
    """`err` as the same kind of OSError about `path` (a full disk, a refused folder), never
    about the temporary file beside it, which no longer exists."""
    return type(err)(err.errno, f"{err.strerror} (writing {str(path)!r}; the file there, if "
                                f"any, is unchanged)", str(path))


def _through_link(path: Path) -> Path:
    """Where to write `path`: the file a symbolic link there points to (the link stays), but
    never through a link planted in a shared folder by someone else. The kernel's
    protected_symlinks refuses open() there: a sticky, world-writable folder (/tmp) whose link
    belongs neither to us nor to the folder's owner; so do we, with PermissionError."""
    if not path.is_symlink():
        return Path(os.path.abspath(path))
    link, folder = os.lstat(path), os.stat(path.parent if str(path.parent) else ".")
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    if shared and link.st_uid not in (os.geteuid(), folder.st_uid):
        raise PermissionError(errno.EACCES, f"{str(path)!r} is a symbolic link another user "
                              f"left in the shared folder {str(path.parent)!r}; it is not "
                              f"followed (remove it or write elsewhere)", str(path))
    return Path(os.path.realpath(path))


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
