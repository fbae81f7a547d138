"""Timers through a ``multiprocessing`` queue, for workers started by ``multiprocessing``.

The seed's ``LocalTimerClient(mp_queue)`` / ``LocalTimerServer(mp_queue)`` pair, and torch's
``MultiprocessingRequestQueue``. The server watches the queue's pipe on the event loop (no
thread, no polling).
"""

from __future__ import annotations

import os
import queue
import time
from typing import Any

from agentd.support.compat.multiprocessing import queue_reader_fd
from agentd.timer.api import RELEASE, RequestQueue, TimerClient, TimerRegistry, TimerRequest
from agentd.timer.server import TimerServer


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


def queue_source(server: TimerRegistry, mp_queue: Any) -> tuple[int, Any]:
    """The fd to watch and the callback that moves queued requests into ``server``."""
    fd = queue_reader_fd(mp_queue)

    def on_readable() -> None:
        requests = drain_queue(mp_queue)
        if requests:
            server.register_timers(requests)

    return fd, on_readable


class MultiprocessingRequestQueue(RequestQueue):
    """torch's ``RequestQueue`` over a ``multiprocessing.Queue``."""

    def __init__(self, mp_queue: Any) -> None:
        self._queue = mp_queue

    def size(self) -> int:
        return int(self._queue.qsize())

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""
        requests: list[TimerRequest] = []
        deadline = time.monotonic() + timeout
        while len(requests) < size:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(block=left > 0, timeout=max(left, 0) or None)
            except (queue.Empty, EOFError, OSError):
                break
            if isinstance(item, TimerRequest):
                requests.append(item)
        return requests


class LocalTimerServer(TimerServer):
    """A timer server fed by a ``multiprocessing.Queue``, which it watches on the loop (no
    polling: ``max_interval`` is accepted for torch and bounds :meth:`_run_watchdog`'s wait).
    A standalone server (no ``trust``) kills an expired pid alone, as torch's does."""

    def __init__(
        self, mp_queue: object, max_interval: float = 60, daemon: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(None, max_interval, daemon, **kwargs)
        self._queue = mp_queue
        self._requests = MultiprocessingRequestQueue(mp_queue)
        self._fd = -1

    def _take_requests(self) -> list[TimerRequest]:
        return self._requests.get(max(1, self._requests.size()), self.max_interval)

    async def start_async(self) -> None:
        import asyncio

        if self._fd < 0:
            self._fd, on_readable = queue_source(self, self._queue)
            asyncio.get_running_loop().add_reader(self._fd, on_readable)
        await super().start_async()

    async def stop_async(self) -> None:
        import asyncio

        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = -1
        await super().stop_async()
