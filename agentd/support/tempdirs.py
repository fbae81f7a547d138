"""Private directories in the system's temporary folder, made without importing tempfile,
and whether the maker of a temporary file or directory still lives.

Importing :mod:`tempfile` (with the shutil and random it imports) is about 2 ms of every
agent's launch, spent to name two directories. These follow its rules where it looks and
how it names, and leave the unusual cases to it: a directory that cannot be made in the
first folder (a ``$TMPDIR`` that does not exist, say) is made by ``tempfile.mkdtemp``.

A process that made a file or directory others sweep when abandoned (a named pipe's
directory, a shared-memory segment) holds an ``flock`` on it while it needs it, which the
kernel lets go with the process (:func:`hold`); a sweeper asks :func:`held`. That holds
in any PID namespace, where a pid in a name does not (it names another process there, or
none).
"""

from __future__ import annotations

import fcntl
import os

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"


def temp_root() -> str:
    """The folder ``tempfile.gettempdir()`` looks at first: ``$TMPDIR``, ``$TEMP`` or
    ``$TMP``, else ``/tmp``."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        if value := os.environ.get(name):
            return os.path.abspath(value)
    return "/tmp"


def private_dir(prefix: str) -> str:
    """A new directory only its owner can use (mode 0700), named ``prefix`` and 8 random
    characters, in :func:`temp_root`: what ``tempfile.mkdtemp(prefix=prefix)`` makes."""
    root = temp_root()
    for _ in range(100):
        name = "".join(_ALPHABET[byte % len(_ALPHABET)] for byte in os.urandom(8))
        path = os.path.join(root, prefix + name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError:
            break
        return path
    import tempfile

    return tempfile.mkdtemp(prefix=prefix)


def hold(fd: int) -> bool:
    """Lock the file or directory open as ``fd`` for as long as it stays open here (False
    where it cannot be locked: a file system without locks, or a holder already)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def held(path: str) -> bool:
    """Whether another process holds the lock on ``path`` (True too where that cannot be
    told: what may be in use is never taken for abandoned)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        return not hold(fd)  # released as it is closed
    finally:
        os.close(fd)
