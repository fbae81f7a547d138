"""Expiration timers (the watchdog): worker-side clients and the agent-side server.

Worker side (light, no torch, no asyncio): ``configure(client)`` and
``with expires(after=30): step()``. Under ``agentd run --file-timer`` a worker needs no
``configure``: :func:`expires` talks to the agent through ``$TORCHELASTIC_TIMER_FILE``,
the same named pipe torch's ``FileTimerClient`` uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.support.lazy import lazy_getattr

_LAZY = {
    "RequestQueue": "agentd.timer.api",
    "TimerClient": "agentd.timer.api",
    "TimerRequest": "agentd.timer.api",
    "configure": "agentd.timer.default_client",
    "expires": "agentd.timer.default_client",
    "get_client": "agentd.timer.default_client",
    "FileTimerClient": "agentd.timer.file_pipe",
    "FileTimerRequest": "agentd.timer.file_pipe",
    "FileTimerServer": "agentd.timer.file_server",
    "TimerServer": "agentd.timer.server",
    "LocalTimerClient": "agentd.timer.local",
    "LocalTimerServer": "agentd.timer.local",
    "MultiprocessingRequestQueue": "agentd.timer.local",
}

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
    "get_client",
]


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)


if TYPE_CHECKING:
    from agentd.timer.api import RequestQueue, TimerClient, TimerRequest
    from agentd.timer.default_client import configure, expires, get_client
    from agentd.timer.file_pipe import FileTimerClient, FileTimerRequest
    from agentd.timer.file_server import FileTimerServer
    from agentd.timer.local import LocalTimerClient, LocalTimerServer, MultiprocessingRequestQueue
    from agentd.timer.server import TimerServer
