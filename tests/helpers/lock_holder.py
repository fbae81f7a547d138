"""A process of its own that holds a file's or directory's lock, as a live agent or
hand-over writer of another PID namespace holds its pipe directory's or its segment's;
SIGKILLed, its lock goes with it, as theirs does when they die."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def lock_holder(path: str) -> Iterator[subprocess.Popen[str]]:
    """A process holding the lock on ``path`` until it is killed (at the latest on exit)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.communicate()  # waits, and closes its pipes
