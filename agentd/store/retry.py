"""Retrying a store request: jittered exponential backoff up to a monotonic deadline (which
failures allow it: :mod:`agentd.store.aiohttp_failures` for the clients on aiohttp,
:mod:`agentd.support.json_client` for the embedded store's)."""

from __future__ import annotations

import asyncio
import random
import time


class Backoff:
    """The pauses between attempts of one request, for at most ``timeout`` seconds.

    :meth:`pause` sleeps before the next attempt and returns True, or returns False at once
    when the next attempt would start past the deadline (the caller then gives up).
    """

    def __init__(self, timeout: float, initial: float = 0.02, maximum: float = 1.0) -> None:
        self.timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._delay = initial
        self._maximum = maximum

    @property
    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self._deadline - time.monotonic())

    async def pause(self) -> bool:
        if time.monotonic() + self._delay > self._deadline:
            return False
        await asyncio.sleep(self._delay * (0.5 + random.random()))
        self._delay = min(self._maximum, self._delay * 2)
        return True
