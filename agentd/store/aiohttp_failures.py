"""Which of aiohttp's client failures allow sending a store request again: those of etcd's
gateway, the store client on aiohttp. (The embedded store's own client and the candidates'
prober say it themselves: :mod:`agentd.support.json_client`.)"""

from __future__ import annotations

import asyncio

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
