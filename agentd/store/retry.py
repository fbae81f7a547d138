"""Retrying a store request: which failures allow it, and jittered exponential backoff up to
a monotonic deadline."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp

NOT_SENT = (aiohttp.ClientConnectorError,)
"""Failures before the request left: always safe to send again."""
MAYBE_SENT = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    asyncio.TimeoutError,
    aiohttp.ClientPayloadError,
)
"""Failures after the request may have reached the server: resend only what is idempotent."""


def refused(exc: BaseException) -> bool:
    """The server's port refused the connection: nothing listens there (now)."""
    return isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, ConnectionRefusedError
    )


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
