"""Timer requests, the client interface, ``configure`` and ``expires`` (worker side).

The same contract as ``torch.distributed.elastic.timer``: a worker acquires a countdown
timer for a scope; if it does not release it before ``expiration_time`` (epoch seconds,
as on the wire), the agent's timer server reaps it.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"
RELEASE = -1.0


@dataclass(frozen=True)
class TimerRequest:
    """Acquire (``expiration_time`` >= 0, epoch seconds) or release (-1) a worker's timer.

    ``worker_id`` is the worker's pid. ``signal`` is what the server sends on expiry; zero
    or negative means "report, do not kill" (torch's convention).
    """

    worker_id: int
    scope_id: str
    expiration_time: float
    signal: int = int(signal.SIGKILL)

    @property
    def worker_pid(self) -> int:
        return self.worker_id

    @property
    def is_release(self) -> bool:
        return self.expiration_time < 0


class TimerClient(abc.ABC):
    """Sends timer requests for the calling process to a timer server."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Start (or move) the timer of ``scope_id``; it expires at ``expiration_time``."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Cancel the timer of ``scope_id``."""


_client: TimerClient | None = None


def configure(timer_client: TimerClient) -> None:
    """Make ``timer_client`` the one :func:`expires` uses by default."""
    global _client
    _client = timer_client


def get_client() -> TimerClient:
    """The configured client; under ``agentd run --file-timer`` one is made on first use."""
    global _client
    if _client is None:
        path = os.environ.get(TIMER_FILE_ENV)
        if not path:
            raise RuntimeError(
                "no timer client: call agentd.timer.configure(...) or run under "
                f"`agentd run --file-timer`, which sets {TIMER_FILE_ENV}"
            )
        from agentd.timer.file_pipe import FileTimerClient

        _client = FileTimerClient(path)
    return _client


@contextlib.contextmanager
def expires(
    after: float, scope: str | None = None, client: TimerClient | None = None
) -> Iterator[None]:
    """Run the block under a timer: unless it finishes within ``after`` seconds, the worker
    is reaped (by default: SIGKILL to its process group, then a restart of the group).
    ``scope`` defaults to the caller's ``file#line``.
    """
    if after < 0:
        raise ValueError(f"after: {after!r} must be >= 0 seconds")
    client = client or get_client()
    if scope is None:
        caller = sys._getframe(2)  # 0: here, 1: contextmanager's __enter__, 2: the caller
        scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)
