"""The worker side's default timer client and the ``expires`` block that uses it.

``configure(client)`` sets it; without one, under ``agentd run --file-timer`` (or torchrun's
file timer) the first use makes a :class:`~agentd.timer.file_pipe.FileTimerClient` on
``$TORCHELASTIC_TIMER_FILE``. Light on purpose: no asyncio, no torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from agentd.timer.api import TimerClient
from agentd.timer.settings import TIMER_FILE_ENV

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
