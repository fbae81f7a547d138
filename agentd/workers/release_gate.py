"""Function workers leave together: each waits, after writing its return value, until
every worker of its attempt on this host has written its own.

torch's function workers wait the same way (for their agent to read all return values)
before they exit. A worker that exits as soon as its function returns tears down its
collectives' connections under a peer still finishing the last one, and gloo aborts that
peer ("terminate called without an active exception"): a job that succeeded then fails.

Two pipes per attempt, inherited by the workers (``$AGENTD_RELEASE_FDS`` names them):
each worker writes one byte to *done* and blocks reading *release*; the agent counts the
bytes on the loop (no polling) and, once all are in, closes its end of *release*, which
every blocked worker reads as end-of-file. A worker that dies instead makes the group
fail and be stopped, as any failure does; an agent that dies closes the pipe with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

RELEASE_FDS_ENV = "AGENTD_RELEASE_FDS"


class ReleaseGate:
    """Agent side: one gate for ``count`` workers of one attempt."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._done_r, self._done_w = os.pipe()
        self._release_r, self._release_w = os.pipe()
        for fd in (self._done_r, self._release_w):
            os.set_inheritable(fd, False)
        self._watching = False

    @property
    def worker_fds(self) -> tuple[int, int]:
        """The ends the workers inherit: (done, release)."""
        return self._done_w, self._release_r

    @property
    def env_value(self) -> str:
        return f"{self._done_w},{self._release_r}"

    def spawned(self) -> None:
        """The workers hold their ends: drop ours, and count the workers that finish."""
        for fd in self.worker_fds:
            os.close(fd)
        self._done_w = self._release_r = -1
        asyncio.get_running_loop().add_reader(self._done_r, self._on_done)
        self._watching = True

    def _on_done(self) -> None:
        data = b""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            data = os.read(self._done_r, 4096)
        self._left -= len(data)
        if self._left <= 0 or not data:
            self.close()

    def close(self) -> None:
        """Release every waiting worker and free the pipes (idempotent)."""
        if self._watching:
            asyncio.get_running_loop().remove_reader(self._done_r)
            self._watching = False
        for name in ("_release_w", "_done_r", "_done_w", "_release_r"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def wait_for_release() -> None:
    """Worker side: say this worker is done, then wait for the others (no-op outside a
    gate)."""
    value = os.environ.pop(RELEASE_FDS_ENV, "")
    if not value:
        return
    done, release = (int(fd) for fd in value.split(","))
    try:
        os.write(done, b"x")
        os.close(done)
        while os.read(release, 1):
            pass
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(release)
