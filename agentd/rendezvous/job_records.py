"""Each member's status record in the store, for the job at a glance (``/job``).

Keys, under ``agentd/<run_id>/job/<generation>/`` (one round's members; a new round
starts afresh)::

    <i>     JSON: member i's record (see :mod:`agentd.jobview.record`), a TTL key
            rewritten every few seconds while its workers run

One small write per node per interval, never per step (:mod:`agentd.jobview.publisher`
paces them), and one read of a round's N keys per ``/job`` request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store


class JobRecords:
    """The status records of one run in ``store``, for the node ``node_id`` whose address
    is ``addr`` (see the module docstring)."""

    def __init__(self, store: Callable[[], Store], keys: RunKeys, node_id: str, addr: str):
        self._store = store
        self._keys = keys
        self.node_id = node_id
        self.addr = addr

    async def publish(self, generation: int, rank: int, doc: dict[str, Any], ttl: float) -> None:
        """Member ``rank``'s record in round ``generation``, for ``ttl`` seconds."""
        await self._store().set(self._keys.job(generation, rank), json.dumps(doc).encode(), ttl)

    async def gather(self, generation: int, size: int) -> tuple[dict[int, dict[str, Any]], int]:
        """Every member's record in round ``generation`` of ``size`` members, by group
        rank (a member that published none, or too long ago, is left out), and how many
        agents wait beyond them (spares, and nodes come since): one request."""
        keys = [self._keys.job(generation, rank) for rank in range(size)]
        *values, joined = await self._store().multi_get(
            [*keys, self._keys.round(generation, "join")]
        )
        records = {rank: json.loads(v) for rank, v in enumerate(values) if v}
        return records, max(0, int(joined or 0) - size)
