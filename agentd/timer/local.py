"""Timers through a ``multiprocessing`` queue, for workers started by ``multiprocessing``.

The seed's ``LocalTimerClient(mp_queue)`` / ``LocalTimerServer(mp_queue)`` pair. The server
watches the queue's pipe on the event loop (no thread, no polling).
"""

from __future__ import annotations

import os
import queue
from typing import Any

from agentd.timer.api import RELEASE, TimerClient, TimerRegistry, TimerRequest


class LocalTimerClient(TimerClient):
    """Puts this process's timer requests on a ``multiprocessing.Queue``."""

    def __init__(self, mp_queue: Any, signal: int = 9) -> None:
        self._queue = mp_queue
        self.signal = signal

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._queue.put(TimerRequest(os.getpid(), scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        self._queue.put(TimerRequest(os.getpid(), scope_id, RELEASE, 0))


def drain_queue(mp_queue: Any) -> list[TimerRequest]:
    """Every request waiting on the queue right now (anything else is dropped)."""
    requests: list[TimerRequest] = []
    while True:
        try:
            item = mp_queue.get_nowait()
        except queue.Empty:
            return requests
        except (EOFError, OSError):
            return requests
        if isinstance(item, TimerRequest):
            requests.append(item)


def _reader_fd(mp_queue: Any) -> int:
    reader = getattr(mp_queue, "_reader", None)
    if reader is None:
        raise TypeError("mp_queue: must be a multiprocessing.Queue")
    return int(reader.fileno())


def queue_source(server: TimerRegistry, mp_queue: Any) -> tuple[int, Any]:
    """The fd to watch and the callback that moves queued requests into ``server``."""
    fd = _reader_fd(mp_queue)

    def on_readable() -> None:
        requests = drain_queue(mp_queue)
        if requests:
            server.register_timers(requests)

    return fd, on_readable
