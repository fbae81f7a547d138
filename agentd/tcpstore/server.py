"""The workers' store, served by the agent: torch's TCPStore wire protocol, server side.

Workers started with ``TORCHELASTIC_USE_AGENT_STORE=True`` connect to ``MASTER_ADDR`` and
``MASTER_PORT`` with torch's ``TCPStore(is_master=False)``, as under torchrun, and find
this server there: on the agent's event loop, with no torch import. So the store outlives
every worker of the attempt (a rank that finishes first no longer takes it down under
the others), and the agent opens a new one for every attempt (stale clients of an earlier
attempt can never reach it).

The wire protocol is :mod:`agentd.tcpstore.session`, the data :mod:`agentd.tcpstore.table`.

Bounded like every listener: connections, key and value sizes, keys per request and the
bytes stored. A client that breaks the protocol (a bad magic, an unknown command, a size
over a bound) has its connection closed, logged once per interval; nobody else notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from agentd.exceptions import cannot_listen
from agentd.support.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from agentd.tcpstore.table import KeyTable, StoreLimits

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4096
"""Connections one workers' store takes at most (before the open-files limit's share)."""


class TCPStoreServer:
    """A TCPStore for the workers of one attempt, on ``host:port`` (0: any free port), or
    on a listening socket the caller reserved (``sock``), with at most ``max_connections``
    open at once. The protocol and the data (:mod:`~agentd.tcpstore.session`,
    :mod:`~agentd.tcpstore.table`) are loaded with the first connection: a job whose
    workers never connect does not import them."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: StoreLimits | None = None,
        sock: object | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.host = host
        self.port = port
        self.limits = limits
        """The table's bounds (None: :class:`~agentd.tcpstore.table.StoreLimits`' defaults)."""
        self.max_connections = max_connections
        self._sock = sock
        self._server: asyncio.Server | None = None
        self._table: KeyTable | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False
        self._problems = RateLimitedLog(log)

    async def start(self, what: str = "workers' store", host_what: str | None = None) -> None:
        """Listen (StartError naming ``what``, the flag or the listener, when it cannot, or
        ``host_what``, the field that gave the address, where this host has no such one)."""
        try:
            if self._sock is not None:
                self._server = await asyncio.start_server(self._serve, sock=self._sock)
            else:
                self._server = await asyncio.start_server(
                    self._serve, self.host, self.port, reuse_address=True
                )
        except OSError as exc:
            raise cannot_listen(exc, self.host, self.port, what, host_what) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.debug("Workers' store listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Close the listener and every connection (workers of this attempt are gone)."""
        server, self._server = self._server, None
        self._closing = True
        if server is not None:
            server.close()
        # A connection accepted just now has a task that has not run yet: let it start (it
        # closes its socket at once, see _serve), or cancelling it before its first step
        # would leave the socket open.
        await asyncio.sleep(0)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    def clear_except(self, prefix: str) -> None:
        """Forget every key outside ``prefix`` (the agents' own), for a new attempt's workers:
        the caller knows that no worker of an earlier attempt is left to use them."""
        if self._table is not None:
            self._table.clear_except(prefix.encode())

    # -- a connection --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from agentd.tcpstore.session import Session
        from agentd.tcpstore.table import ProtocolError

        task = asyncio.current_task()
        assert task is not None
        full = len(self._connections) >= self.max_connections
        self._connections.add(task)  # even one turned away: stop() waits for its close
        try:
            if self._closing:  # accepted as the store stopped: not served
                return
            if full:
                self._problems.warning(
                    "full",
                    "Workers' store: %d connections open, the most it takes; closing new ones",
                    self.max_connections,
                )
                return
            session = Session(self._keys(), reader, writer)
            await session.run()
        except ProtocolError as exc:
            self._problems.warning("protocol", "Workers' store: closed a connection: %s", exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # a client that went away
        except asyncio.CancelledError:  # stop(), which waits for us: end as a closed one
            pass  # (raised on, Python 3.11's start_server logs it as an ERROR with a trace)
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()
            self._connections.discard(task)

    def _keys(self) -> KeyTable:
        """The store's data, made with the first connection and kept for every other."""
        if self._table is None:
            from agentd.tcpstore.table import KeyTable, StoreLimits

            self._table = KeyTable(self.limits or StoreLimits())
        return self._table
