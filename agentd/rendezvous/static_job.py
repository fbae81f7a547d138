"""The job at a glance for a static job of several nodes: each agent's status record in
node 0's store, as the elastic backends keep theirs (:mod:`~agentd.rendezvous.job_records`),
over the agent's side connection to it (which its claim's beat shares).

Keys, under ``/agentd/static/job/<round>/`` (one round of node 0's store; a new round,
new keys)::

    <node rank>   JSON: that node's record (see :mod:`agentd.jobview.record`), rewritten
                  every few seconds while its workers run

A TCPStore keeps no TTL: a node lost mid-round keeps its last record, whose age grows,
until the round it ends. The records go over a connection of their own, so a ``/job``
request never waits behind the agent's long waits in the store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.rendezvous.api import RendezvousConnectionError
from agentd.rendezvous.static_claims import PREFIX

if TYPE_CHECKING:
    from agentd.tcpstore.client import TCPStoreClient

CONNECT_FOR = 2.0
"""Seconds a record's request tries to reach node 0's store."""


def job_key(round_: int, rank: int) -> str:
    """The store key of node ``rank``'s record in round ``round_`` of node 0's store."""
    return f"{PREFIX}job/{round_}/{rank}"


class StaticJobRecords:
    """The status records of a static job in node 0's store at ``host:port``, for the node
    ``node_id`` reachable at ``addr``; ``store_round`` maps the agent's generation to the
    store's round (they differ once node 0's agent was started again)."""

    def __init__(
        self,
        host: str,
        port: Callable[[], int],
        node_id: str,
        addr: str,
        store_round: Callable[[int], int],
    ) -> None:
        self._host = host
        self._port = port
        self.node_id = node_id
        self.addr = addr
        self._store_round = store_round
        self._client: TCPStoreClient | None = None
        self._connecting = asyncio.Lock()

    async def publish(self, generation: int, rank: int, doc: dict[str, Any], ttl: float) -> None:
        """Node ``rank``'s record in round ``generation`` (``ttl``: kept until the round
        ends, see the module docstring)."""
        value = json.dumps(doc).encode()
        await self._request(lambda c: c.set(job_key(self._store_round(generation), rank), value))

    async def gather(self, generation: int, size: int) -> tuple[dict[int, dict[str, Any]], int]:
        """Every node's record in round ``generation`` of ``size`` nodes, by node rank (one
        that published none is left out), and no spares (a static job has none)."""
        keys = [job_key(self._store_round(generation), rank) for rank in range(size)]
        values = await self._request(lambda c: c.multi_get(keys))
        return {rank: json.loads(v) for rank, v in enumerate(values) if v}, 0

    async def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to ``key`` over the same connection (the claim's beat)."""
        return int(await self._request(lambda c: c.add(key, delta)))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _request(self, call: Callable[[TCPStoreClient], Any]) -> Any:
        from agentd.tcpstore.client import TCPStoreClient

        where = f"{self._host}:{self._port()}"
        try:
            async with self._connecting:
                if self._client is None:
                    self._client = await TCPStoreClient.connect(
                        self._host, self._port(), CONNECT_FOR
                    )
                client = self._client
            return await call(client)
        except (ConnectionError, OSError, TimeoutError) as exc:
            await self.close()  # the next request connects again (node 0 may be back)
            raise RendezvousConnectionError(f"the job's store at {where}: {exc}") from None
