"""Embedding an aiohttp app in the running loop: one way, for every server agentd runs.

Every listener is bounded (:class:`Limits`): at most ``max_connections`` open at once, a
connection that has not sent a whole request within ``idle_timeout`` (a slowloris, or an
idle keep-alive) is closed, and handlers of a client that went away are cancelled. A
connection beyond the cap gets a ready-made ``503`` and is closed at once, without a
request handler or a task; that is logged once per interval, never per connection.

A client's malformed request (a NUL byte in a header, an oversized header line, a bad
request line: aiohttp's ``HttpProcessingError``) is answered 400 by aiohttp and logged by
:class:`ServerLog` as one WARNING line per interval with the count so far, never as a
traceback: anyone who can connect could otherwise fill the log. A request whose header
names or values are not UTF-8 (aiohttp hands such bytes to handlers as surrogate escapes,
which break any handler that encodes them) is answered 400 naming the header before any
handler runs, and counted the same way. A failure of agentd's own handlers keeps its
traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from agentd.exceptions import cannot_listen
from agentd.support.compat import aiohttp as compat_aiohttp
from agentd.support.ratelog import RateLimitedLog

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """How much one listener may hold (see the module docstring)."""

    max_connections: int = 64
    idle_timeout: float = 5.0
    """Seconds a connection may take to send a whole request's headers, or sit idle
    between requests, before it is closed."""
    body_timeout: float = 10.0
    """Seconds a request's body may take to arrive (for handlers that read one)."""
    cancel_abandoned: bool = True
    """Cancel a request's handler when its client disconnects (long polls would otherwise
    run their course for nobody)."""
    log_interval: float = 10.0
    """Seconds between two log lines of one kind of client fault (the count goes on)."""
    backlog: int = 128
    """The listen backlog: what asyncio accepts in one go before answering any, so the
    room a cap leaves below the descriptor limit (``fdlimits.ACCEPT_BURST``)."""


class ServerLog:
    """The logger aiohttp's request handlers of one listener report to (``logger=``).

    A protocol error of the client becomes one WARNING line per ``interval`` naming the
    listener, the count so far, the latest client and what was wrong; anything else is
    logged with its traceback, as aiohttp would.
    """

    def __init__(self, what: str, interval: float = 10.0) -> None:
        self._what = what
        self._problems = RateLimitedLog(log, interval)
        self.malformed = 0
        """Malformed requests answered 400 since the listener started."""
        self._last: BaseException | None = None
        """The fault counted last: aiohttp reports a broken body again when it drains the
        rest after the handler has answered, with the same exception."""

    def debug(self, message: str, *args: object, **kwargs: Any) -> None:
        _aiohttp_log.debug(message, *args, **kwargs)

    def exception(
        self, message: str, *args: object, exc_info: object = True, **kwargs: Any
    ) -> None:
        if not is_client_fault(exc_info):
            _aiohttp_log.exception(message, *args, exc_info=exc_info, **kwargs)  # type: ignore[arg-type]
            return
        assert isinstance(exc_info, BaseException)
        self.client_fault(str(args[0]) if args and "from %s" in message else "a client", exc_info)

    def client_fault(self, client: str, exc: BaseException) -> None:
        """Count the malformed request ``exc`` from ``client``; log it within the limit."""
        if exc is self._last:
            return
        self._last = exc
        self.refused(client, client_problem(exc))

    def refused(self, client: str, problem: str) -> None:
        """Count a request from ``client`` answered 400 for ``problem``; log it within the
        limit."""
        self.malformed += 1
        self._problems.warning(
            "malformed",
            "%s: answered 400 to %d malformed request(s) so far; the latest from %s: %s",
            self._what,
            self.malformed,
            client,
            _one_line(problem),
        )


def undecodable_header(raw_headers: tuple[tuple[bytes, bytes], ...]) -> str | None:
    """What is wrong with the first header whose name or value is not UTF-8, or None."""
    for name, value in raw_headers:
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            return f"a header name: {name[:40]!r} is not valid UTF-8"
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return f"header {name.decode()}: its value is not valid UTF-8"
    return None


def _header_guard(server_log: ServerLog) -> Any:
    """The middleware that answers 400 to headers that are not UTF-8 (module docstring)."""
    from aiohttp import web

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> Any:
        problem = undecodable_header(request.raw_headers)
        if problem is None:
            return await handler(request)
        server_log.refused(str(request.remote), problem)
        return web.json_response({"error": problem}, status=400)

    return guard


def is_client_fault(exc: object) -> bool:
    """``exc`` is aiohttp's word that a client sent a malformed request or body."""
    from aiohttp.http_exceptions import HttpProcessingError
    from aiohttp.web_protocol import RequestPayloadError

    return isinstance(exc, HttpProcessingError | RequestPayloadError)


def client_problem(exc: BaseException) -> str:
    """What was wrong with a client's request, without aiohttp's ``400, message:`` frame."""
    text = str(getattr(exc, "message", "") or exc)
    return re.sub(r"^\d{3}, message:\s*", "", text)


_aiohttp_log = logging.getLogger("aiohttp.server")


def _one_line(text: str, limit: int = 160) -> str:
    """``text`` on one line, at most ``limit`` characters (a client chose it)."""
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RefusedConnection(asyncio.Protocol):
    """A connection over the cap: answered 503 and closed, nothing read."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # any loop's (uvloop's are not subclasses)
        transport.write(self._answer)
        transport.close()


_KEEPALIVE_RECHECK = 0.1
"""Seconds an idle-connection close waits, so the loop polls for I/O first (see below)."""


def _freeze_safe(handler_class: type) -> type:
    """aiohttp's request handler, whose idle-connection timer looks again after the loop
    has polled for I/O. After a stall (a frozen process), the loop's first poll can return
    on its timeout, empty, and run every overdue timer before reading any socket: the
    timer then closed connections with a request waiting unread (the client gets a
    reset), such as the heartbeats a frozen store must answer when it resumes."""
    return compat_aiohttp.keepalive_deferred(handler_class, _KEEPALIVE_RECHECK)


class _Bounded:
    """The protocol factory a site serves: the runner's aiohttp ``Server`` while it has
    room, :class:`RefusedConnection` beyond ``limit`` open connections. Everything else (shutdown,
    the connection list) is the server's own."""

    def __init__(self, server: web.Server, limit: int, what: str) -> None:
        self._server = server
        self._limit = limit
        self._what = what
        body = json.dumps({"error": f"{what}: too many connections ({limit}); retry"}).encode()
        self._answer = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        self._problems = RateLimitedLog(log)
        self._handler_class: type | None = None
        self.refused = 0

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self._server.connections) >= self._limit:
            self.refused += 1
            self._problems.warning(
                "full",
                "%s: %d connections open, the most it takes; "
                "refusing new ones with 503 (%d so far)",
                self._what,
                self._limit,
                self.refused,
            )
            return RefusedConnection(self._answer)
        handler = self._server()
        if self._handler_class is None:
            self._handler_class = _freeze_safe(type(handler))
        compat_aiohttp.become(handler, self._handler_class)
        return handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    what: str,
    limits: Limits | None = None,
    server_log: ServerLog | None = None,
    ssl_context: ssl.SSLContext | None = None,
    host_what: str | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: an ephemeral port) inside the current loop, over
    TLS with ``ssl_context``; aiohttp reports to ``server_log`` (a new :class:`ServerLog`
    by default).

    Returns the runner (``await runner.cleanup()`` stops it) and the port really bound.
    A port that cannot be bound is a :class:`StartError` naming ``what`` and the address
    (``host_what`` where this host has no such address).
    """
    from aiohttp import web

    bounds = limits or Limits()

    BoundedRunner = compat_aiohttp.runner_class(
        lambda server: _Bounded(server, bounds.max_connections, what)
    )
    if server_log is None:
        server_log = ServerLog(what, bounds.log_interval)
    app.middlewares.insert(0, _header_guard(server_log))

    # Long polls would hold a stop for up to a minute; clients retry them elsewhere.
    runner = BoundedRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=0.5,
        keepalive_timeout=bounds.idle_timeout,
        lingering_time=min(2.0, bounds.body_timeout),  # reading an unwanted body's rest
        handler_cancellation=bounds.cancel_abandoned,
        logger=server_log,
    )
    await runner.setup()
    site = web.TCPSite(
        runner, host, port, reuse_address=True, backlog=bounds.backlog, ssl_context=ssl_context
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise cannot_listen(exc, host, port, what, host_what) from None
    return runner, int(runner.addresses[0][1])
