"""The drain protocol (:mod:`agentd.rendezvous.drains`) of a static job of several nodes,
over node 0's store: a TCPStore, which has keys and waits but no revisions or watches.

Here they are made of what it has. Every write of the protocol goes through
:class:`StaticDrainStore`: it writes the key, then adds 1 to a counter (the revision)
and sets a marker key for the new count. A watch from revision ``r`` waits for marker
``r + 1``, so a write made after the watcher read the revision always wakes it (the key
is written before the count moves: a watcher that read the new count also reads the
key). A writer that dies between the count and its marker leaves that marker unset:
watchers on it wake at their timeout instead (the drain's watches look again every
5 s), and the next write's marker wakes the later ones.

The counter and markers live under the agents' prefix, which node 0 never clears; the
protocol's own keys (``agentd/<run id>/drain/``) go with the workers' keys when the next
round starts, so an agent that joins later (a replacement) never follows a drain that
is over, even one whose draining agent died before it withdrew its request.

A waiting request holds its connection, so each request takes the idle connection, or
opens one: a watch never delays a report. One connection is kept between requests, so
an agent holds one more connection to node 0's store while its workers run (the drain's
watch, re-armed every 5 s), and a second only for the moments a drain's reports overlap
it. Connections go when their request fails, and reach node 0's store anew the next
time (its agent may be back).
A value that is empty counts as missing (a TCPStore answers a missing key with an
empty value); the protocol never writes one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from agentd.rendezvous.static_claims import PREFIX
from agentd.store.api import StoreTimeout, StoreUnavailable, WatchResult

if TYPE_CHECKING:
    from agentd.tcpstore.client import TCPStoreClient

COUNTER = PREFIX + "drain/revision"
"""How many writes the drain protocol made in this store."""
CONNECT_FOR = 2.0
"""Seconds a request tries to reach node 0's store before it fails."""
IDLE_KEPT = 1
"""Idle connections kept for the next request (node 0's store serves every agent and
every worker of the job: each connection counts against its bound)."""


def marker(revision: int) -> str:
    """The key set once the protocol's write number ``revision`` is in the store."""
    return f"{COUNTER}/{revision}"


class StaticDrainStore:
    """The drain protocol's store (:class:`~agentd.rendezvous.drains.DrainStore`) on node
    0's TCPStore at ``host:port()`` (see the module docstring)."""

    def __init__(self, host: str, port: Callable[[], int]) -> None:
        self._host = host
        self._port = port
        self._idle: list[TCPStoreClient] = []
        self._closed = False

    async def set(self, key: str, value: bytes) -> int:
        async with self._connection() as client:
            await client.set(key, value)
            return await self._count(client)

    async def delete(self, key: str) -> bool:
        async with self._connection() as client:
            existed = await client.delete(key)
            await self._count(client)
            return existed

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        """Set ``key`` to ``desired`` if it holds ``expected`` (None: is missing); whether
        it was set, and what it holds now."""
        async with self._connection() as client:
            now = await client.compare_set(key, expected or b"", desired)
            if now != desired:
                return False, now or None
            await self._count(client)
            return True, now

    async def get(self, key: str) -> bytes | None:
        (value,) = await self.multi_get([key])
        return value

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        async with self._connection() as client:
            return [v or None for v in await client.multi_get(list(keys))]

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        async with self._connection() as client:
            present = await client.wait(list(keys), timeout)
        if not present:
            raise StoreTimeout(f"{len(keys)} key(s) not set within {timeout:g}s")

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        """Wait up to ``timeout`` seconds for a write after ``after_revision`` (to any key
        of the protocol: ``prefix`` only narrows what the caller reads again); the
        revision now. No events: the caller reads the keys it follows."""
        async with self._connection() as client:
            await client.wait([marker(after_revision + 1)], timeout)
            return WatchResult(await client.add(COUNTER, 0))

    async def revision(self) -> int:
        async with self._connection() as client:
            return await client.add(COUNTER, 0)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for client in idle:
            await client.close()

    async def _count(self, client: TCPStoreClient) -> int:
        """Count a write (its key is in the store) and set its marker; the new revision."""
        revision = await client.add(COUNTER, 1)
        await client.set(marker(revision), b"1")
        return revision

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[TCPStoreClient]:
        """An idle connection, or a new one; kept for the next request unless it failed
        (``StoreUnavailable`` then, naming the store)."""
        from agentd.tcpstore.client import TCPStoreClient

        if self._closed:
            raise StoreUnavailable("the drain's store connections are closed")
        where = f"{self._host}:{self._port()}"
        kept = False
        try:
            client = (
                self._idle.pop()
                if self._idle
                else await TCPStoreClient.connect(self._host, self._port(), CONNECT_FOR)
            )
        except TimeoutError as exc:
            raise StoreUnavailable(f"the job's store at {where}: {exc}") from None
        try:
            yield client
            kept = not self._closed and len(self._idle) < IDLE_KEPT
        except (ConnectionError, OSError) as exc:
            raise StoreUnavailable(f"the job's store at {where}: {exc}") from None
        finally:
            if kept:
                self._idle.append(client)
            else:
                await client.close()
