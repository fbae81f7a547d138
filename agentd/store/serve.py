"""``agentd store``: run the store server alone until a stop signal."""

from __future__ import annotations

import asyncio
import logging
import signal

from agentd import fdlimits
from agentd.ratelog import rate_limited_loop_errors
from agentd.store.server import MAX_CONNECTIONS, StoreServer

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def serve(host: str, port: int, token: str | None) -> int:
    """Serve until SIGTERM/SIGINT/SIGHUP; returns 128+N as every agentd command does."""
    soft = fdlimits.raise_open_files_limit()
    cap = fdlimits.listener_cap(MAX_CONNECTIONS, soft, fdlimits.BASE_RESERVE)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(rate_limited_loop_errors())
    server = StoreServer(host, port, token, max_connections=cap)
    await server.start()
    received: list[int] = []
    stopped = asyncio.Event()

    def on_signal(signum: int) -> None:  # only records intent; the flow below stops
        received.append(signum)
        stopped.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await stopped.wait()
        signum = received[0]
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        await server.stop()
    log.info("Store stopped by %s", signal.Signals(signum).name)
    return 128 + signum
