"""``agentd store``: run the store server alone until a stop signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Sequence

from agentd.store.candidacy import Candidacy
from agentd.store.server import StoreServer
from agentd.store.tls import StoreTls
from agentd.store.wire import MAX_CONNECTIONS
from agentd.support import fast_loop, fdlimits
from agentd.support.ratelog import rate_limited_loop_errors

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def serve(
    host: str,
    port: int,
    token: str | None,
    peers: Sequence[str] = (),
    index: int | None = None,
    tls: StoreTls | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT/SIGHUP; returns 128+N as every agentd command does.
    With ``peers``, as candidate ``index`` among them (standing by until promoted); with
    ``tls``, over TLS (:mod:`agentd.store.tls`)."""
    soft = fdlimits.raise_open_files_limit()
    cap = fdlimits.listener_cap(MAX_CONNECTIONS, soft, fdlimits.BASE_RESERVE)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(rate_limited_loop_errors())
    candidacy = None
    if peers and index is not None and token:
        candidacy = Candidacy(peers, index, token, tls=tls)
    server = StoreServer(host, port, token, max_connections=cap, candidacy=candidacy, tls=tls)
    received: list[int] = []
    stopped = asyncio.Event()

    def on_signal(signum: int) -> None:  # only records intent; the flow below stops
        received.append(signum)
        stopped.set()

    # before the start, so a stop signal sent once it says it serves is always ours
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.start()
        gc.freeze()  # what the start made lives as long as the store: never scan it again
        log.info("Store: serving on %s's event loop", fast_loop.loop_name(loop))
        if candidacy is not None:
            log.info("Standing by as store candidate %d of %d", index, len(peers))
        await stopped.wait()
        signum = received[0]
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        await server.stop()
    log.info("Store stopped by %s", signal.Signals(signum).name)
    return 128 + signum
