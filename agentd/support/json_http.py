"""A small HTTP/1.1 server for a JSON API on the hot path: one ``asyncio.Protocol`` per
connection, no framework objects per request.

The embedded store answers a few requests per node per rendezvous; behind aiohttp's
application, routing and middleware, its CPU per join was twice what it is on this server
(about 750 against 352 us at 1,024 nodes, ``bench/bench_rdzv.py``). This server parses
what a JSON API's clients send (a request line, headers, a ``Content-Length`` body) and
nothing more, and keeps every bound the aiohttp listeners of :mod:`agentd.support.http_site` keep:

* at most ``max_connections`` open; one more gets a ready-made ``503`` and is closed;
* a connection that has not sent a whole request's head within ``idle_timeout`` of
  connecting or of its last answer is closed, unless its bytes wait unread in the kernel
  (a loop behind on a burst of thousands of requests, or resuming from a stall, reads
  them first: closing then lost requests that had been sent in time);
* a body that has not arrived within ``body_timeout`` is answered ``408``; a head over
  :data:`MAX_HEAD` bytes (or a line over ``MAX_LINE``), a chunked or a compressed body
  (its clients send neither) and anything malformed (the request line, a header, a
  ``Content-Length``, bytes that are not UTF-8) ``400`` naming what; a body over
  ``max_body`` bytes (or the ``body_limit`` its head is given) ``413``; each 400 counted by
  :class:`~agentd.support.http_site.ServerLog`, one log line per interval;
* a handler whose client disconnects is cancelled (long polls end with their client);
* requests on one connection are answered in order (pipelining), one at a time.

Every error is a JSON document ``{"error": "..."}``. The handler gets a :class:`Request`
and returns ``(status, JSON bytes, extra headers)``; an exception from it (a bug: the
handler answers its own errors) is logged with its traceback and answered ``500``.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import sys
import termios
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, cast

from agentd.exceptions import cannot_listen
from agentd.support.http_messages import (
    MAX_HEAD,
    Malformed,
    Request,
    body_length,
    encode_answer,
    error_body,
    parse_head,
)
from agentd.support.http_site import Limits, RefusedConnection, ServerLog
from agentd.support.ratelog import RateLimitedLog

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

IDLE_RECHECK = 0.1
"""Seconds between two looks at a connection past its deadline whose client's bytes wait
unread (the loop is behind)."""
LINGER = 2.0
"""Seconds a connection answered with a close reads (and drops) what its client still
sends, so the client reads the answer rather than a reset."""
LISTEN_QUEUE = 4096
"""Connections the kernel holds for the loop to accept (the system's ``somaxconn`` caps
it): a rendezvous's nodes connect at once, and a connection the queue cannot hold waits
a second for its SYN to be sent again (4,096 nodes: heartbeats failed to connect within
10 s behind a queue of 128)."""
Answer = tuple[int, bytes, Mapping[str, str]]
Handler = Callable[[Request], Awaitable[Answer]]


class JsonHttpServer:
    """Serves ``handler`` on ``host:port`` (0: an ephemeral port) inside the running loop;
    ``what`` names the listener in log lines and errors. A request's body may hold
    ``max_body`` bytes, or what ``body_limit`` gives for its path and headers (a larger
    limit for one authorized operation, read before the body is)."""

    def __init__(
        self,
        handler: Handler,
        what: str,
        limits: Limits,
        server_log: ServerLog,
        max_body: int,
        body_limit: Callable[[str, Mapping[str, str]], int] | None = None,
    ) -> None:
        self.handler = handler
        self.what = what
        self.limits = limits
        self.server_log = server_log
        self.max_body = max_body
        self.body_limit = body_limit or (lambda path, headers: max_body)
        self.connections: set[_Connection] = set()
        self.refused = 0
        self._full = RateLimitedLog(log)
        self._server: asyncio.Server | None = None
        self._full_answer = encode_answer(
            503,
            error_body(f"{what}: too many connections ({limits.max_connections}); retry"),
            {"Retry-After": "1"},
            close=True,
        )

    async def start(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        what: str | None = None,
        host_what: str | None = None,
    ) -> int:
        """Listen; the port really bound. One that cannot be is a :class:`StartError`
        naming ``what`` (the port's option; the server's own ``what`` by default), or
        ``host_what`` (the address's) where this host has no such address."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self._protocol,
                host,
                port,
                reuse_address=True,
                backlog=self.limits.backlog,
                ssl=ssl_context,
            )
        except OSError as exc:
            raise cannot_listen(exc, host, port, what or self.what, host_what) from None
        for listening in self._server.sockets:
            _deepen(listening.fileno())
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, drop every connection and cancel what their handlers do (long
        polls would hold a stop for up to a minute; clients retry them elsewhere)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.drop()
        await asyncio.sleep(0)  # let the cancelled handlers and the closes run

    def _protocol(self) -> asyncio.Protocol:
        if len(self.connections) >= self.limits.max_connections:
            self.refused += 1
            self._full.warning(
                "full",
                "%s: %d connections open, the most it takes; "
                "refusing new ones with 503 (%d so far)",
                self.what,
                self.limits.max_connections,
                self.refused,
            )
            return RefusedConnection(self._full_answer)
        return _Connection(self)


def _deepen(fd: int) -> None:
    """Let the kernel queue :data:`LISTEN_QUEUE` connections on the listening socket ``fd``
    (asyncio listens with its accept burst, ``Limits.backlog``): calling ``listen`` again
    on a listening socket changes only its queue."""
    listening = socket.socket(fileno=fd)
    try:
        listening.listen(LISTEN_QUEUE)
    finally:
        listening.detach()


class _Connection(asyncio.Protocol):
    """One client connection: reads requests, answers them in order, one at a time."""

    def __init__(self, server: JsonHttpServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._peer = "a client"
        self._buffer = bytearray()
        self._head: tuple[str, str, dict[str, str], bool] | None = None
        self._length = 0
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._paused = False

    # -- asyncio's side ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # any loop's (uvloop's are not subclasses)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if peer else "a client"
        self._server.connections.add(self)
        self._wait(self._server.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # lingering: what a client still sends after our last answer is dropped
        self._buffer += data
        if self._task is None:
            self._next()
        elif len(self._buffer) > MAX_HEAD + self._server.max_body and not self._paused:
            self._paused = True  # a client pipelining without reading our answers
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # a client that stops sending has gone: close, cancel its handler

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()

    def drop(self) -> None:
        """Close now (the server stops)."""
        if self._transport is not None:
            self._transport.close()
        if self._task is not None:
            self._task.cancel()

    # -- requests ----------------------------------------------------------------------------

    def _next(self) -> None:
        """Start on the next whole request in the buffer, if there is one."""
        try:
            if self._head is None:
                if not self._read_head():
                    return
                if len(self._buffer) < self._length:  # the body's clock starts once
                    self._wait(self._server.limits.body_timeout)
                    return
            elif len(self._buffer) < self._length:
                return
        except Malformed as exc:
            if exc.status == 400:
                self._server.server_log.refused(self._peer, str(exc))
            self._finish(exc.status, error_body(str(exc)))
            return
        assert self._head is not None
        method, path, headers, keep_alive = self._head
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        self._head = None
        self._deadline = 0.0  # no timer closes a connection whose request is being answered
        request = Request(method, path, headers, body, self._peer)
        self._task = self._loop.create_task(self._answer(request, keep_alive))

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise Malformed(f"request head: longer than {MAX_HEAD} bytes")
            return False
        start = 0
        while self._buffer.startswith(b"\r\n", start):  # blank lines between requests
            start += 2
        head = bytes(self._buffer[start:end])
        del self._buffer[: end + 4]
        method, path, headers, keep_alive = parse_head(head)
        self._length = body_length(headers, self._server.body_limit(path, headers))
        self._head = (method, path, headers, keep_alive)
        if headers.get("expect", "").lower() == "100-continue" and len(self._buffer) < self._length:
            assert self._transport is not None
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    async def _answer(self, request: Request, keep_alive: bool) -> None:
        try:
            status, body, headers = await self._server.handler(request)
        except asyncio.CancelledError:
            return  # the client went away, or the server stops
        except Exception:
            self._task = None
            log.exception("%s: the handler of %s failed", self._server.what, request.path)
            if not self._closing:
                self._finish(500, error_body("internal error"))
            return
        self._task = None
        if self._closing:
            return
        if not keep_alive:
            self._finish(status, body, headers)
            return
        assert self._transport is not None
        self._transport.write(encode_answer(status, body, headers, close=False))
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        self._wait(self._server.limits.idle_timeout)
        if self._buffer:
            self._next()

    def _finish(self, status: int, body: bytes, headers: Mapping[str, str] = {}) -> None:
        """Answer with ``Connection: close``, then close after a linger (module docstring)."""
        transport = self._transport
        assert transport is not None
        self._closing = True
        self._buffer.clear()
        transport.write(encode_answer(status, body, headers, close=True))
        if transport.can_write_eof():
            transport.write_eof()
        if self._paused:
            transport.resume_reading()
        self._loop.call_later(LINGER, transport.close)

    # -- timers ------------------------------------------------------------------------------

    def _wait(self, seconds: float) -> None:
        """Close the connection unless a whole request arrives within ``seconds``: one
        timer per connection, moved lazily (a request does not cancel and re-arm it)."""
        self._deadline = self._loop.time() + seconds
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()  # an earlier deadline (a body's): re-armed
            self._timer = None
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self._closing or not self._deadline:
            return
        if self._loop.time() < self._deadline:  # moved since it was armed
            self._timer = self._loop.call_at(self._deadline, self._expired)
            return
        if self._unread():
            # the client's bytes wait in the kernel: the loop is behind (busy, or resumed
            # from a stall, with overdue timers run before any socket is read), not the
            # client; look again once it has read them
            self._timer = self._loop.call_later(IDLE_RECHECK, self._expired)
            return
        if self._head is not None:  # a head, but the body did not come in time
            timeout = self._server.limits.body_timeout
            self._finish(408, error_body(f"body: not received within {timeout:g}s"))
            return
        assert self._transport is not None
        self._closing = True
        self._transport.close()

    def _unread(self) -> bool:
        """Bytes from the client wait on the socket, not yet read by the loop."""
        assert self._transport is not None
        sock = self._transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(pending, sys.byteorder) > 0
