"""``agentd store``: its flags checked, then the store server alone until a stop signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Sequence

from agentd.exceptions import ConfigError, StartError
from agentd.store import amnesia
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import parse_candidates
from agentd.store.server import StoreServer
from agentd.store.tls import StoreTls
from agentd.store.wire import MAX_CONNECTIONS
from agentd.support import fast_loop, fdlimits
from agentd.support.net import endpoint_text
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
    tasks: list[asyncio.Task[None]] = []

    def on_signal(signum: int) -> None:  # only records intent; the flow below stops
        received.append(signum)
        stopped.set()

    # before the start, so a stop signal sent once it says it serves is always ours
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.start("--port", "--host")
        if candidacy is None:  # a candidate's successor inherits the state instead
            tasks = _remember_leases(server)
        gc.freeze()  # what the start made lives as long as the store: never scan it again
        log.info("Store: serving on %s's event loop", fast_loop.loop_name(loop))
        if candidacy is not None:
            log.info("Standing by as store candidate %d of %d", index, len(peers))
        await stopped.wait()
        signum = received[0]
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        for task in tasks:
            task.cancel()
        await server.stop()
    log.info("Store stopped by %s", signal.Signals(signum).name)
    return 128 + signum


def _remember_leases(server: StoreServer) -> list[asyncio.Task[None]]:
    """A single store's lease record, and its word to new nodes where its previous self
    on this port may have left leases behind (:mod:`agentd.store.amnesia`)."""
    try:
        record = amnesia.AliveRecord.for_port(server.port)
    except StartError as exc:
        log.warning("Store: keeps no lease record: %s", exc)
        return []
    forgot = record.load()  # the previous self's, before this one writes its own
    tasks = [asyncio.create_task(record.keep(server.store), name="store-record")]
    if forgot is not None and forgot.worth_telling:
        log.warning(
            "Store: started again on port %d %.1fs after its previous self last held leases "
            "(TTLs up to %gs): it tells agents so, and a new round waits until those leases "
            "have ended or their members are back",
            server.port,
            forgot.ago,
            forgot.ttl,
        )
        tasks.append(asyncio.create_task(amnesia.tell(server.store, forgot), name="store-word"))
    return tasks


def served_tls(cacert: str | None, cert: str | None, key: str | None) -> StoreTls | None:
    """``agentd store``'s ``--cacert``, ``--cert`` and ``--key``, their files checked
    (None: plain HTTP)."""
    if not (cert or key or cacert):
        return None
    if not cert:
        rule = "required to serve the store over TLS (--cacert and --key go with it)"
        raise ConfigError(f"--cert: {rule}")
    return StoreTls(cacert, cert, key, flags=True)


def peers_from_flag(
    text: str, host: str, port: int, token: str | None
) -> tuple[list[str], int | None]:
    """``--peers`` checked: the candidate list and this store's place in it."""
    if not text:
        return [], None
    peers = [endpoint_text(*pair) for pair in parse_candidates(text, "--peers")]
    own = endpoint_text(host, port)
    if own not in peers:
        raise ConfigError(
            f"--peers: {text!r} must list this store's own address {own!r} "
            "(--host:--port), spelled the same"
        )
    if not token:
        raise ConfigError(
            "--store-token: required with --peers: the candidates and every "
            "agent share it (set AGENTD_STORE_TOKEN)"
        )
    return peers, peers.index(own)
