"""One connection to the workers' store: torch's TCPStore wire protocol, read and answered.

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
"""

from __future__ import annotations

import asyncio
import struct

from agentd.tcpstore.table import KeyTable, ProtocolError

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


class Session:
    """One client connection: read a command, answer it, until the client leaves."""

    def __init__(
        self, table: KeyTable, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._store = table
        self._limits = table.limits
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
        current = store.get(key)
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
        self._send_value(self._store.get(await self._key()) or b"")

    async def add(self) -> None:
        key = await self._key()
        delta = int(_I64.unpack(await self._reader.readexactly(8))[0])
        old = self._store.get(key)
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
        self._store.put(key, (self._store.get(key) or b"") + value)

    async def multi_get(self) -> None:
        keys = [await self._key() for _ in range(await self._count())]
        for key in keys:
            self._send_value(self._store.get(key) or b"")

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
    PING: Session.ping,
    SET: Session.set,
    COMPARE_SET: Session.compare_set,
    GET: Session.get,
    ADD: Session.add,
    CHECK: Session.check,
    WAIT: Session.wait,
    GETNUMKEYS: Session.num_keys,
    DELETE_KEY: Session.delete_key,
    APPEND: Session.append,
    MULTI_GET: Session.multi_get,
    MULTI_SET: Session.multi_set,
    CANCEL_WAIT: Session.cancel_wait,
    QUEUE_PUSH: Session.queue_push,
    QUEUE_POP: Session.queue_pop,
    QUEUE_LEN: Session.queue_len,
}
