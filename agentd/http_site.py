"""Embedding an aiohttp app in the running loop: one way, for every server agentd runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.exceptions import StartError

if TYPE_CHECKING:
    from aiohttp import web


async def serve_app(
    app: web.Application, host: str, port: int, what: str
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: an ephemeral port) inside the current loop.

    Returns the runner (``await runner.cleanup()`` stops it) and the port really bound.
    A port that cannot be bound is a :class:`StartError` naming ``what`` and the address.
    """
    from aiohttp import web

    # Long polls would hold a stop for up to a minute; clients retry them elsewhere.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise StartError(f"{what}: cannot listen on {host}:{port} ({exc.strerror})") from None
    return runner, int(runner.addresses[0][1])
