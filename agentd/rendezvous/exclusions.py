"""Nodes that keep themselves out of a job (their node checks failed), as the store tells.

An excluded agent puts why under ``excluded/<node>`` (:mod:`agentd.rendezvous.keys`) for as
long as its cooldown lasts. The agent that seals a round looks up the exclusions of the
members of the last sealed round that are missing from the new one (:func:`exclusions_of`);
they travel in the round's summary, so every member's :class:`Exclusions` says why
the world is smaller, in the log and in ``/status``, without a request of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store

log = logging.getLogger(__name__)


class Exclusions:
    """This node's exclusion in the store, and the peers' it finds missing."""

    def __init__(self, store: Callable[[], Store], keys: RunKeys, node_id: str) -> None:
        self._store = store
        self._keys = keys
        self._node_id = node_id
        self.peers: dict[str, dict[str, Any]] = {}
        """The exclusions of the members the last round lost (by node id)."""

    async def publish(self, doc: dict[str, Any] | None, grace: float) -> None:
        """Put this node's exclusion ``doc`` for its cooldown and ``grace`` seconds more
        (None: delete it)."""
        key = self._keys.excluded(self._node_id)
        if doc is None:
            await self._store().delete(key)
        else:
            await self._store().set(key, json.dumps(doc).encode(), ttl=doc["cooldown"] + grace)

    def after_round(self, run_id: str, excluded: Mapping[str, dict[str, Any]]) -> None:
        """A round formed without the nodes in ``excluded`` (their exclusions, by node id),
        which were members of the last one."""
        self.peers = dict(excluded)
        for node, doc in excluded.items():
            log.warning(
                "Rendezvous %s: node %s is out of the job: %s", run_id, node, doc.get("reason", "?")
            )


async def exclusions_of(
    store: Store, keys: RunKeys, nodes: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The exclusions the store holds for ``nodes``, by node id (a node without one is
    left out)."""
    if not nodes:
        return {}
    values = await store.multi_get([keys.excluded(node) for node in nodes])
    return {node: json.loads(v) for node, v in zip(nodes, values, strict=True) if v}
