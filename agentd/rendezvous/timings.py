"""Each node's compute times and the job's verdict on them, through the rendezvous store.

Keys, under ``agentd/<run_id>/timings/<generation>/`` (one round's members; a new round
starts afresh)::

    <i>        JSON {"node", "host", "sections": {name: seconds}, "at"}: member i's recent
               compute time per section (a TTL key, rewritten every few seconds)
    verdict    JSON {"median", "nodes", "slow", "swap", "at"}: group rank 0's comparison of
               every member (written when it changes)

One small write per node every few seconds and one read of the verdict: never per step
(:mod:`agentd.slownodes.service` paces them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store


class NodeTimings:
    """The timings protocol of one run in ``store`` (see the module docstring)."""

    def __init__(self, store: Callable[[], Store], keys: RunKeys) -> None:
        self._store = store
        self._keys = keys

    async def publish(self, generation: int, rank: int, doc: dict[str, Any], ttl: float) -> None:
        """Member ``rank``'s times in round ``generation``, for ``ttl`` seconds."""
        key = self._keys.timings(generation, str(rank))
        await self._store().set(key, json.dumps(doc).encode(), ttl=ttl)

    async def gather(self, generation: int, size: int) -> dict[int, dict[str, Any]]:
        """Every member's times in round ``generation`` of ``size`` members (one request;
        a member that published none, or too long ago, is left out)."""
        keys = [self._keys.timings(generation, str(rank)) for rank in range(size)]
        values = await self._store().multi_get(keys)
        return {rank: json.loads(v) for rank, v in enumerate(values) if v}

    async def verdict(self, generation: int) -> dict[str, Any] | None:
        raw = await self._store().get(self._keys.timings(generation, "verdict"))
        return json.loads(raw) if raw else None

    async def decide(self, generation: int, verdict: dict[str, Any]) -> None:
        await self._store().set(
            self._keys.timings(generation, "verdict"), json.dumps(verdict).encode()
        )
