"""Private directories in the system's temporary folder, made without importing tempfile.

Importing :mod:`tempfile` (with the shutil and random it imports) is about 2 ms of every
agent's launch, spent to name two directories. These follow its rules where it looks and
how it names, and leave the unusual cases to it: a directory that cannot be made in the
first folder (a ``$TMPDIR`` that does not exist, say) is made by ``tempfile.mkdtemp``.
"""

from __future__ import annotations

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
