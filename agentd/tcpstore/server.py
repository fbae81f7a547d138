"""The workers' store, served by the agent: torch's TCPStore wire protocol, server side.

Workers started with ``TORCHELASTIC_USE_AGENT_STORE=True`` connect to ``MASTER_ADDR`` and
``MASTER_PORT`` with torch's ``TCPStore(is_master=False)``, as under torchrun, and find
this server there: on the agent's event loop, with no torch import. So the store outlives
every worker of the attempt (a rank that finishes first no longer takes it down under
the others), and the agent opens a new one for every attempt (stale clients of an earlier
attempt can never reach it).

The protocol, as torch 2.x clients speak it (every integer little-endian; a string or a
value is a u64 length and its bytes; the client prefixes keys with ``/``):

    VALIDATE (0) u32 magic           first on every connection; no answer
    PING (13) u32 nonce              answered with the nonce
    SET (1) key value                no answer (wakes waiters)
    COMPARE_SET (2) key exp new      the value now (a missing key with an empty expected
                                     value is set; otherwise the expected value comes back)
    GET (3) key                      the value (empty when missing: clients WAIT first)
    ADD (4) key i64                  the new total (kept as its decimal text)
    CHECK (5) u64 n, n keys          READY (0) or NOT_READY (1)
    WAIT (6) u64 n, n keys           STOP_WAITING (0) once every key exists; meanwhile the
                                     connection is read for CANCEL_WAIT (12), answered
                                     WAIT_CANCELED (1)
    GETNUMKEYS (7)                   i64
    DELETE_KEY (8) key               i64, how many were deleted
    APPEND (9) key value             no answer (wakes waiters)
    MULTI_GET (10) u64 n, n keys     n values
    MULTI_SET (11) u64 n, n pairs    no answer
    QUEUE_PUSH (14) key value        no answer (wakes one waiter)
    QUEUE_POP (15) key               i64 size before the pop, then the value if any
    QUEUE_LEN (16) key               i64

Bounded like every listener: connections, key and value sizes, keys per request and the
bytes stored. A client that breaks the protocol (a bad magic, an unknown command, a size
over a bound) has its connection closed, logged once per interval; nobody else notices.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from typing import NamedTuple

from agentd.exceptions import StartError
from agentd.support.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

MAGIC = 0x3C85F7CE
(
    VALIDATE,
    SET,
    COMPARE_SET,
    GET,
    ADD,
    CHECK,
    WAIT,
    GETNUMKEYS,
    DELETE_KEY,
    APPEND,
    MULTI_GET,
    MULTI_SET,
    CANCEL_WAIT,
    PING,
    QUEUE_PUSH,
    QUEUE_POP,
    QUEUE_LEN,
) = range(17)
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")


MAX_CONNECTIONS = 4096
"""Connections one workers' store takes at most (before the open-files limit's share)."""


class StoreLimits(NamedTuple):
    """How much one workers' store takes."""

    max_connections: int = MAX_CONNECTIONS
    max_key: int = 64 << 10
    max_value: int = 64 << 20
    max_keys: int = 1 << 17
    """Keys in one request (torch's own server takes as many)."""
    max_bytes: int = 1 << 30
    """Keys and values held at once."""


class ProtocolError(Exception):
    """A client broke the protocol; its connection is closed (the message says how)."""


class TCPStoreServer:
    """A TCPStore for the workers of one attempt, on ``host:port`` (0: any free port), or
    on a listening socket the caller reserved (``sock``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: StoreLimits | None = None,
        sock: object | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.limits = limits or StoreLimits()
        self._sock = sock
        self._server: asyncio.Server | None = None
        self._data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, collections.deque[bytes]] = {}
        self._bytes = 0
        self._changed = asyncio.Event()
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False
        self._problems = RateLimitedLog(log)

    async def start(self) -> None:
        try:
            if self._sock is not None:
                self._server = await asyncio.start_server(self._serve, sock=self._sock)
            else:
                self._server = await asyncio.start_server(
                    self._serve, self.host, self.port, reuse_address=True
                )
        except OSError as exc:
            raise StartError(
                f"workers' store: cannot listen on {self.host}:{self.port} ({exc.strerror})"
            ) from None
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

    # -- a connection --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        full = len(self._connections) >= self.limits.max_connections
        self._connections.add(task)  # even one turned away: stop() waits for its close
        try:
            if self._closing:  # accepted as the store stopped: not served
                return
            if full:
                self._problems.warning(
                    "full",
                    "Workers' store: %d connections open, the most it takes; closing new ones",
                    self.limits.max_connections,
                )
                return
            session = _Session(self, reader, writer)
            await session.run()
        except ProtocolError as exc:
            self._problems.warning("protocol", "Workers' store: closed a connection: %s", exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # a client that went away
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()
            self._connections.discard(task)

    # -- the data ----------------------------------------------------------------------------

    def present(self, key: bytes) -> bool:
        """A key that exists, or a queue that holds something (what WAIT and CHECK ask)."""
        return key in self._data or bool(self._queues.get(key))

    def put(self, key: bytes, value: bytes) -> None:
        old = self._data.get(key)
        grown = len(value) - (len(old) if old is not None else -len(key))
        if self._bytes + grown > self.limits.max_bytes:
            raise ProtocolError(f"the store is full ({self.limits.max_bytes} bytes)")
        self._bytes += grown
        self._data[key] = value
        self._wake()

    def delete(self, key: bytes) -> int:
        old = self._data.pop(key, None)
        if old is None:
            return 0
        self._bytes -= len(key) + len(old)
        return 1

    def push(self, key: bytes, value: bytes) -> None:
        if self._bytes + len(value) > self.limits.max_bytes:
            raise ProtocolError(f"the store is full ({self.limits.max_bytes} bytes)")
        self._bytes += len(value)
        self._queues.setdefault(key, collections.deque()).append(value)
        self._wake()

    def pop(self, key: bytes) -> tuple[int, bytes | None]:
        queue = self._queues.get(key)
        if not queue:
            return 0, None
        size, value = len(queue), queue.popleft()
        self._bytes -= len(value)
        if not queue:
            del self._queues[key]
        return size, value

    def queue_len(self, key: bytes) -> int:
        return len(self._queues.get(key) or ())

    def num_keys(self) -> int:
        return len(self._data)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def until_present(self, keys: list[bytes]) -> None:
        while not all(self.present(key) for key in keys):
            await self._changed.wait()


class _Session:
    """One client connection: read a command, answer it, until the client leaves."""

    def __init__(
        self, store: TCPStoreServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._store = store
        self._limits = store.limits
        self._reader = reader
        self._writer = writer

    async def run(self) -> None:
        if await self._byte() != VALIDATE or await self._u32() != MAGIC:
            raise ProtocolError("it did not open with torch's validation magic")
        while True:
            command = await self._byte()
            handler = _HANDLERS.get(command)
            if handler is None:
                raise ProtocolError(f"unknown command {command}")
            await handler(self)
            await self._writer.drain()

    # -- reading -----------------------------------------------------------------------------

    async def _byte(self) -> int:
        return (await self._reader.readexactly(1))[0]

    async def _u32(self) -> int:
        return int(_U32.unpack(await self._reader.readexactly(4))[0])

    async def _count(self) -> int:
        count = int(_U64.unpack(await self._reader.readexactly(8))[0])
        if count > self._limits.max_keys:
            raise ProtocolError(f"{count} keys in one request, more than {self._limits.max_keys}")
        return count

    async def _bytes(self, limit: int, what: str) -> bytes:
        size = int(_U64.unpack(await self._reader.readexactly(8))[0])
        if size > limit:
            raise ProtocolError(f"a {what} of {size} bytes, more than {limit}")
        return await self._reader.readexactly(size)

    async def _key(self) -> bytes:
        return await self._bytes(self._limits.max_key, "key")

    async def _value(self) -> bytes:
        return await self._bytes(self._limits.max_value, "value")

    # -- writing -----------------------------------------------------------------------------

    def _send_value(self, value: bytes) -> None:
        self._writer.write(_U64.pack(len(value)) + value)

    def _send_i64(self, value: int) -> None:
        self._writer.write(_I64.pack(value))

    # -- the commands ------------------------------------------------------------------------

    async def ping(self) -> None:
        self._writer.write(_U32.pack(await self._u32()))

    async def set(self) -> None:
        key, value = await self._key(), await self._value()
        self._store.put(key, value)

    async def compare_set(self) -> None:
        key, expected, desired = await self._key(), await self._value(), await self._value()
        store = self._store
        current = store._data.get(key)
        if current is None:
            if expected:
                store._wake()
                self._send_value(expected)
                return
            store.put(key, desired)
            self._send_value(desired)
            return
        if current == expected:
            store.put(key, desired)
            current = desired
        else:
            store._wake()
        self._send_value(current)

    async def get(self) -> None:
        self._send_value(self._store._data.get(await self._key(), b""))

    async def add(self) -> None:
        key = await self._key()
        delta = int(_I64.unpack(await self._reader.readexactly(8))[0])
        old = self._store._data.get(key)
        try:
            total = delta + (int(old) if old is not None else 0)
        except ValueError:
            raise ProtocolError(
                f"add to a key that holds no integer ({(old or b'')[:20]!r})"
            ) from None
        self._store.put(key, str(total).encode())
        self._send_i64(total)

    async def check(self) -> None:
        keys = [await self._key() for _ in range(await self._count())]
        ready = all(self._store.present(key) for key in keys)
        self._writer.write(READY if ready else NOT_READY)

    async def wait(self) -> None:
        keys = [await self._key() for _ in range(await self._count())]
        store = self._store
        if all(store.present(key) for key in keys):
            self._writer.write(STOP_WAITING)
            return
        # Wait for the keys while reading the connection: the client's one possible next
        # message is CANCEL_WAIT (its own timeout ran out).
        done = asyncio.ensure_future(store.until_present(keys))
        cancel = asyncio.ensure_future(self._byte())
        try:
            await asyncio.wait({done, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (done, cancel):
                if not task.done():
                    task.cancel()
            await asyncio.gather(done, cancel, return_exceptions=True)
        if done.done() and not done.cancelled():
            self._writer.write(STOP_WAITING)
            if cancel.done() and not cancel.cancelled() and cancel.exception() is None:
                await self._after_wait(cancel.result())  # both at once: answer the cancel too
            return
        await self._after_wait(cancel.result())

    async def _after_wait(self, command: int) -> None:
        if command != CANCEL_WAIT:
            raise ProtocolError(f"command {command} while a WAIT was pending")
        self._writer.write(WAIT_CANCELED)

    async def cancel_wait(self) -> None:
        self._writer.write(WAIT_CANCELED)  # nothing was pending: the wait had just ended

    async def num_keys(self) -> None:
        self._send_i64(self._store.num_keys())

    async def delete_key(self) -> None:
        self._send_i64(self._store.delete(await self._key()))

    async def append(self) -> None:
        key, value = await self._key(), await self._value()
        self._store.put(key, self._store._data.get(key, b"") + value)

    async def multi_get(self) -> None:
        keys = [await self._key() for _ in range(await self._count())]
        for key in keys:
            self._send_value(self._store._data.get(key, b""))

    async def multi_set(self) -> None:
        for _ in range(await self._count()):
            key, value = await self._key(), await self._value()
            self._store.put(key, value)

    async def queue_push(self) -> None:
        key, value = await self._key(), await self._value()
        self._store.push(key, value)

    async def queue_pop(self) -> None:
        size, value = self._store.pop(await self._key())
        self._send_i64(size)
        if value is not None:
            self._send_value(value)

    async def queue_len(self) -> None:
        self._send_i64(self._store.queue_len(await self._key()))


_HANDLERS = {
    PING: _Session.ping,
    SET: _Session.set,
    COMPARE_SET: _Session.compare_set,
    GET: _Session.get,
    ADD: _Session.add,
    CHECK: _Session.check,
    WAIT: _Session.wait,
    GETNUMKEYS: _Session.num_keys,
    DELETE_KEY: _Session.delete_key,
    APPEND: _Session.append,
    MULTI_GET: _Session.multi_get,
    MULTI_SET: _Session.multi_set,
    CANCEL_WAIT: _Session.cancel_wait,
    QUEUE_PUSH: _Session.queue_push,
    QUEUE_POP: _Session.queue_pop,
    QUEUE_LEN: _Session.queue_len,
}
