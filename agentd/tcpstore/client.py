"""A TCPStore client on the event loop: torch's wire protocol (:mod:`agentd.tcpstore.session`),
client side, with no torch import.

What an agent needs to meet its peers in a TCPStore that group rank 0's agent serves (the
static rendezvous): connect, retrying until a deadline while that agent is not up yet;
set, compare-and-set, add, delete, read several keys, and wait for keys with a timeout. One
request is in flight at a time. A connection that breaks, or a request abandoned half way
(cancelled), closes the client: every later request raises ``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

from agentd.support.aio import close_stream
from agentd.tcpstore.session import (
    ADD,
    CANCEL_WAIT,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    MAGIC,
    MULTI_GET,
    READY,
    SET,
    STOP_WAITING,
    VALIDATE,
    WAIT,
    WAIT_CANCELED,
)

_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
_RETRY_FIRST, _RETRY_MOST = 0.05, 1.0


def _blob(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _keys(keys: list[str]) -> bytes:
    return _U64.pack(len(keys)) + b"".join(_blob(key.encode()) for key in keys)


class TCPStoreClient:
    """One connection to a TCPStore (see the module docstring); build it with :meth:`connect`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._broken = False

    @classmethod
    async def connect(cls, host: str, port: int, retry_for: float) -> TCPStoreClient:
        """Connect to ``host:port``, retrying a refused or unresolvable address (its server
        is not up yet) for up to ``retry_for`` seconds; then ``TimeoutError`` naming the
        last reason."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_for
        delay = _RETRY_FIRST
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                break
            except OSError as exc:
                if loop.time() + delay > deadline:
                    why = exc.strerror or str(exc)
                    raise TimeoutError(
                        f"no store at {host}:{port} within {retry_for:.0f}s ({why})"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MOST)
        writer.write(bytes([VALIDATE]) + _U32.pack(MAGIC))
        return cls(reader, writer)

    async def close(self) -> None:
        """Close the connection (again: a no-op); every later request raises ConnectionError."""
        self._broken = True
        await close_stream(self._writer)

    # -- requests ----------------------------------------------------------------------------

    async def set(self, key: str, value: bytes) -> None:
        async with self._request():
            self._writer.write(bytes([SET]) + _blob(key.encode()) + _blob(value))
            await self._writer.drain()

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """``desired`` when it was set (the key held ``expected``; a missing key counts as
        holding ``b""``), else what the key holds."""
        async with self._request():
            self._writer.write(
                bytes([COMPARE_SET]) + _blob(key.encode()) + _blob(expected) + _blob(desired)
            )
            return await self._value()

    async def add(self, key: str, delta: int) -> int:
        """The key's new total (a missing key starts at 0)."""
        async with self._request():
            self._writer.write(bytes([ADD]) + _blob(key.encode()) + _I64.pack(delta))
            return int(_I64.unpack(await self._reader.readexactly(8))[0])

    async def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        async with self._request():
            self._writer.write(bytes([DELETE_KEY]) + _blob(key.encode()))
            return int(_I64.unpack(await self._reader.readexactly(8))[0]) > 0

    async def check(self, keys: list[str]) -> bool:
        """Whether every key exists now."""
        async with self._request():
            self._writer.write(bytes([CHECK]) + _keys(keys))
            return await self._reader.readexactly(1) == READY

    async def multi_get(self, keys: list[str]) -> list[bytes]:
        """The keys' values (``b""`` for a missing key: wait for them first)."""
        async with self._request():
            self._writer.write(bytes([MULTI_GET]) + _keys(keys))
            return [await self._value() for _ in keys]

    async def wait(self, keys: list[str], seconds: float | None = None) -> bool:
        """True once every key exists; False when ``seconds`` pass first (the
        server is told to stop waiting, and the connection stays usable)."""
        async with self._request():
            self._writer.write(bytes([WAIT]) + _keys(keys))
            await self._writer.drain()
            answer = asyncio.ensure_future(self._reader.readexactly(1))
            try:
                await asyncio.wait({answer}, timeout=seconds)
                if answer.done():
                    return answer.result() == STOP_WAITING
                self._writer.write(bytes([CANCEL_WAIT]))
                if await answer == WAIT_CANCELED:
                    return False
                # The keys came as we cancelled: the cancel's own answer follows.
                if await self._reader.readexactly(1) != WAIT_CANCELED:
                    raise ConnectionError("the store answered a cancelled wait out of turn")
                return True
            finally:
                answer.cancel()

    # -- plumbing ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _request(self) -> AsyncIterator[None]:
        """One request at a time; one that fails or is abandoned half way breaks the
        connection for good (its answer could still arrive, out of turn). A connection the
        server closed raises ``ConnectionError``."""
        async with self._lock:
            if self._broken:
                raise ConnectionError("the store connection is closed")
            done = False
            try:
                yield
                done = True
            except asyncio.IncompleteReadError:
                raise ConnectionError("the store closed the connection") from None
            finally:
                if not done:
                    await self.close()

    async def _value(self) -> bytes:
        size = int(_U64.unpack(await self._reader.readexactly(8))[0])
        return await self._reader.readexactly(size)
