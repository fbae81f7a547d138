"""Timer requests, the client interface, and what a request source feeds (the server).

The same contract as ``torch.distributed.elastic.timer``: a worker acquires a countdown
timer for a scope; if it does not release it before ``expiration_time`` (epoch seconds,
as on the wire), the agent's timer server reaps it.
"""

from __future__ import annotations

import abc
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

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


class RequestQueue(abc.ABC):
    """torch's source of timer requests for a polling :class:`TimerServer`."""

    @abc.abstractmethod
    def size(self) -> int:
        """How many requests are waiting now."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds."""


class TimerRegistry(Protocol):
    """What a source of timer requests (the named pipe, a ``multiprocessing`` queue) feeds:
    the timer server (:class:`agentd.timer.server.TimerServer`)."""

    def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None:
        """Acquire or release the timers of trusted workers (untrusted pids are dropped)."""
        ...

    def count_bad(self, kind: str, detail: str) -> None:
        """Count (and log within a rate limit) an input that was dropped, and why."""
        ...
