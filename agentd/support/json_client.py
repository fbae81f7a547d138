"""A small HTTP/1.1 client for a JSON API on the hot path: keep-alive connections to one
origin, each an ``asyncio.Protocol`` carrying one request at a time.

The counterpart of :mod:`agentd.support.json_http`: a rendezvous of thousands of nodes
spent two thirds of each node's CPU in aiohttp's client machinery, around requests whose
bodies are a few hundred bytes (``bench/bench_rdzv.py``). This client writes a request
in one call and parses its answer (a status line, headers, a ``Content-Length`` body, or
a body up to the close) without a task, a stream or a timer of its own.

Failures say whether the request may have reached the server, which decides whether the
caller may send it again:

* :class:`NotSent`: connecting failed (refused, unreachable, timed out); nothing left;
* :class:`MaybeSent`: the connection failed or timed out after the request was written,
  or the answer was not HTTP;
* :class:`TlsFailed`: the TLS handshake failed (a certificate refused either way).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

MAX_ANSWER_HEAD = 64 << 10
"""The most bytes an answer's status line and headers may take."""
_FIELD = re.compile(rb"\r\n([^:\r\n]*):[ \t]*([^\r\n]*)")


class NotSent(Exception):
    """The request never left: connecting failed."""

    def __init__(self, problem: BaseException) -> None:
        super().__init__(f"cannot connect: {problem}")
        self.refused = isinstance(problem, ConnectionRefusedError)
        """Nothing listens there (now)."""


class MaybeSent(Exception):
    """The request may have reached the server (its outcome is unknown)."""


class TlsFailed(Exception):
    """The TLS handshake failed; the ``ssl.SSLError`` is the cause."""


@dataclass(slots=True)
class Reply:
    """An answer: its status, headers (names in lower case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


SocketFactory = Callable[[tuple[Any, ...]], socket.socket]


class JsonClient:
    """Keep-alive connections to ``host:port`` (over TLS with ``ssl_context``), each made
    by ``socket_factory`` from an address-info tuple; an idle one is kept ``keepalive``
    seconds (0: none; each closes after its answer). Requests run concurrently, one per
    connection."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        keepalive: float = 5.0,
        socket_factory: SocketFactory | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._keepalive = keepalive
        self._socket_factory = socket_factory
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False
        authority = f"[{host}]" if ":" in host else host
        self._host_line = f"Host: {authority}:{port}\r\n".encode()

    async def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        answer_within: float | None,
        connect_within: float,
    ) -> Reply:
        """POST ``body`` (JSON) to ``path``; the answer, within ``answer_within`` seconds of
        being sent (None: as long as the connection lives) after connecting within
        ``connect_within``."""
        if self._closed:
            raise NotSent(ConnectionError("the client is closed"))
        connection = self._reuse() or await self._connect(connect_within)
        head = [b"POST %s HTTP/1.1\r\n" % path.encode(), self._host_line]
        head.extend(f"{name}: {value}\r\n".encode() for name, value in headers.items())
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        head.append(body)
        waiter = connection.send(b"".join(head))
        timer = None
        if answer_within is not None:  # a timer, not asyncio.timeout: a tenth of its cost
            timer = asyncio.get_running_loop().call_later(answer_within, connection.time_out)
        try:
            reply = await waiter
        except MaybeSent:
            connection.close()
            if connection.timed_out:
                raise MaybeSent(f"no answer within {answer_within:g}s") from None
            raise
        except BaseException:
            connection.close()  # cancelled: the answer, if it comes, is nobody's
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if connection.reusable and self._keepalive > 0 and not self._closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        return reply

    def close(self) -> None:
        """Close every connection; a request after this fails as not sent."""
        self._closed = True
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def _reuse(self) -> _Connection | None:
        """The connection idle the shortest time that is still open and young enough; the
        ones idle too long are closed (the list is in the order they fell idle)."""
        expired = time.monotonic() - self._keepalive
        idle = self._idle
        while idle and (idle[0].idle_since <= expired or not idle[0].reusable):
            idle.pop(0).close()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and connection.idle_since > expired and connection.open:
                return connection
            connection.close()
        return None

    async def _connect(self, within: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                sock = await self._socket(loop)
                try:
                    _, connection = await loop.create_connection(
                        lambda: _Connection(self._open),
                        sock=sock,
                        ssl=self._ssl,
                        server_hostname=self.host if self._ssl is not None else None,
                    )
                except asyncio.CancelledError:
                    # only its handshake's wait is cancelled, and its transport owns the
                    # socket then: after a TLS handshake it closes gracefully, reading on,
                    # so a close here would free the descriptor under it for the next
                    # socket ("File descriptor N is used by transport")
                    raise
                except BaseException:
                    sock.close()  # no transport took it, or it was aborted
                    raise
        except ssl.SSLError as exc:
            raise TlsFailed(str(exc)) from exc
        except TimeoutError:
            raise NotSent(TimeoutError(f"not connected within {within:g}s")) from None
        except OSError as exc:
            raise NotSent(exc) from exc
        return connection

    async def _socket(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        """A socket connected to the first address of ``host`` that answers."""
        infos: list[tuple[Any, ...]]
        try:
            version = ipaddress.ip_address(self.host).version
        except ValueError:  # a name
            infos = list(await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        else:  # TCP by name, so asyncio turns Nagle's algorithm off, as aiohttp's client did
            family = socket.AF_INET6 if version == 6 else socket.AF_INET
            infos = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.host, self.port))]
        problem: OSError = OSError(f"{self.host}: no address")
        for info in infos:
            factory = self._socket_factory
            sock = factory(info) if factory else socket.socket(info[0], info[1], info[2])
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, info[4])
                if sock.getsockname() == sock.getpeername():
                    # TCP connects a socket given, as its own, the port it asks for to
                    # itself: no server is reached, and the port its server wants is held
                    raise ConnectionRefusedError(
                        f"connected to itself: nothing listens on {self.host}:{self.port}"
                    )
                return sock
            except OSError as exc:
                sock.close()
                problem = exc
            except BaseException:
                sock.close()
                raise
        raise problem


class _Connection(asyncio.Protocol):
    """One connection: a request written whole, its answer parsed as it comes."""

    def __init__(self, registry: set[_Connection]) -> None:
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Reply] | None = None
        self._head: tuple[int, dict[str, str]] | None = None
        self._length: int | None = None
        self._keep = True
        self.reusable = False
        self.idle_since = 0.0
        self.timed_out = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # any loop's (uvloop's are not subclasses)
        self._transport = transport
        self._registry.add(self)
        self.reusable = True

    def send(self, request: bytes) -> asyncio.Future[Reply]:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.reusable = False
        self._transport.write(request)
        return self._waiter

    @property
    def open(self) -> bool:
        """Its transport is not closing (a close may be on its way as a FIN is read)."""
        return self._transport is not None and not self._transport.is_closing()

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def time_out(self) -> None:
        """The answer did not come in time: fail its request, close."""
        self.timed_out = True
        self._fail(MaybeSent("no answer in time"))
        self.close()

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection is not ours to trust
            return
        self._buffer += data
        try:
            reply = self._parse()
        except ValueError as exc:
            self._fail(MaybeSent(f"the answer is not HTTP: {exc}"))
            self.close()
            return
        if reply is not None:
            self._waiter.set_result(reply)
            self._waiter = None
            self.reusable = self._keep and not self._buffer

    def eof_received(self) -> bool:
        self.reusable = False
        if self._head is not None and self._length is None:  # a body that ends at the close
            self._finish(bytes(self._buffer))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        self.reusable = False
        if self._head is not None and self._length is None:
            self._finish(bytes(self._buffer))
        why = f"the connection was lost ({exc})" if exc else "the server closed the connection"
        self._fail(MaybeSent(why))

    def _fail(self, problem: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(problem)
        self._waiter = None

    def _finish(self, body: bytes) -> None:
        assert self._head is not None
        status, headers = self._head
        self._head = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(Reply(status, headers, body))
        self._waiter = None

    def _parse(self) -> Reply | None:
        """The whole answer, once it is in the buffer (None: not yet)."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_ANSWER_HEAD:
                    raise ValueError(f"a head longer than {MAX_ANSWER_HEAD} bytes")
                return None
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            first = head.find(b"\r\n")
            line = head if first < 0 else head[:first]
            code = line[9:12]
            if not line.startswith(b"HTTP/1.") or not code.isdigit():
                raise ValueError(f"status line {line[:80]!r}")
            headers = {
                name.decode("latin-1").lower(): value.decode("latin-1").rstrip()
                for name, value in _FIELD.findall(head, max(first, 0))
            }
            self._head = int(code), headers
            self._keep = headers.get("connection", "").lower() != "close"
            length = headers.get("content-length")
            self._length = int(length) if length is not None and length.isdigit() else None
            if int(code) == 100:  # an interim answer: the real one follows
                self._head = None
                return self._parse()
        if self._length is None or len(self._buffer) < self._length:
            return None
        status, headers = self._head
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        self._head = None
        return Reply(status, headers, body)
