"""Expiration timers (the watchdog): worker-side clients and the agent-side server.

Worker side (light, no torch, no asyncio): ``configure(client)`` and
``with expires(after=30): step()``. Under ``agentd run --file-timer`` a worker needs no
``configure``: :func:`expires` talks to the agent through ``$TORCHELASTIC_TIMER_FILE``,
the same named pipe torch's ``FileTimerClient`` uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.support.lazy import lazy_getattr
from agentd.timer.api import TimerClient, TimerRequest
from agentd.timer.default_client import configure, expires, get_client

_LAZY = {
    "FileTimerClient": "agentd.timer.file_pipe",
    "FileTimerServer": "agentd.timer.server",
    "TimerServer": "agentd.timer.server",
    "LocalTimerClient": "agentd.timer.local",
    "LocalTimerServer": "agentd.timer.server",
}

__all__ = [
    "FileTimerClient",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
    "get_client",
]


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)


if TYPE_CHECKING:
    from agentd.timer.file_pipe import FileTimerClient
    from agentd.timer.local import LocalTimerClient
    from agentd.timer.server import FileTimerServer, LocalTimerServer, TimerServer
