"""Nodes that keep themselves out of a job (their node checks failed), as the store tells.

An excluded agent puts why under ``excluded/<node>`` (:mod:`agentd.rendezvous.keys`) for as
long as its cooldown lasts. After each round, :class:`Exclusions` looks up the members of
the previous round that are missing from the new one, so a smaller world comes with its
reason in the log and in ``/status``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store, StoreError

log = logging.getLogger(__name__)


class Exclusions:
    """This node's exclusion in the store, and the peers' it finds missing."""

    def __init__(self, store: Callable[[], Store], keys: RunKeys, node_id: str) -> None:
        self._store = store
        self._keys = keys
        self._node_id = node_id
        self._members: list[str] = []
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

    async def after_round(self, run_id: str, nodes: Sequence[dict[str, Any]]) -> None:
        """A round formed with ``nodes``: say why any member of the last one is missing."""
        members = [str(node["node"]) for node in nodes]
        missing = [node for node in self._members if node not in members]
        self._members = members
        self.peers = {}
        if not missing:
            return
        try:
            values = await self._store().multi_get([self._keys.excluded(n) for n in missing])
        except StoreError as exc:
            log.debug("Rendezvous %s: could not read exclusions: %s", run_id, exc)
            return
        for node, value in zip(missing, values, strict=True):
            if value is None:
                continue
            with_reason = json.loads(value)
            self.peers[node] = with_reason
            log.warning("Rendezvous %s: node %s is out of the job: %s", run_id, node,
                        with_reason.get("reason", "?"))  # fmt: skip
