"""The workers' store's data: its keys, values and queues, within the store's bounds."""

from __future__ import annotations

import asyncio
import collections
from typing import NamedTuple


class StoreLimits(NamedTuple):
    """How much one workers' store holds (its connections are the server's bound)."""

    max_key: int = 64 << 10
    max_value: int = 64 << 20
    max_keys: int = 1 << 17
    """Keys in one request (torch's own server takes as many)."""
    max_bytes: int = 1 << 30
    """Keys and values held at once."""


class ProtocolError(Exception):
    """A client broke the protocol; its connection is closed (the message says how)."""


class KeyTable:
    """The keys and queues of one workers' store; a write wakes whoever waits on keys."""

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, collections.deque[bytes]] = {}
        self._bytes = 0
        self._changed = asyncio.Event()

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

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

    def clear_except(self, prefix: bytes) -> None:
        """Drop every key and queue whose name does not start with ``prefix``."""
        for key in [k for k in self._data if not k.startswith(prefix)]:
            self.delete(key)
        for key in [k for k in self._queues if not k.startswith(prefix)]:
            self._bytes -= sum(len(value) for value in self._queues.pop(key))

    def num_keys(self) -> int:
        return len(self._data)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def until_present(self, keys: list[bytes]) -> None:
        while not all(self.present(key) for key in keys):
            await self._changed.wait()
