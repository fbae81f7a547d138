"""What an agent says while its round waits to be sealed: every :data:`FIRST_EVERY`
seconds for the first minute, then every :data:`THEN_EVERY`, how many nodes joined of how
many, what the round waits for (its minimum, or the last call), and, from the first
member of the last round back (the one that checks the others' leases), which of that
round's nodes are not back yet, each by its address and node id.

Only that one agent reads the names (the last round's entries once, then the round's own
arrivals and the missing ones' gone markers at each report): the others count, so a
large job's store pays for one list, not one per node."""

from __future__ import annotations

import json
import logging

from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.round import RoundSettings
from agentd.store.api import Store

log = logging.getLogger(__name__)

FIRST_EVERY = 10.0
FIRST_FOR = 60.0
THEN_EVERY = 60.0
NAMED = 8
"""The most missing nodes named in one line (the rest are counted)."""


class WaitReport:
    """The lines of one wait in round ``generation``, which began at ``since``."""

    def __init__(
        self,
        run_id: str,
        store: Store,
        keys: RunKeys,
        settings: RoundSettings,
        generation: int,
        since: float,
        carried: Carried | None,
    ) -> None:
        self._run_id, self._store, self._keys = run_id, store, keys
        self._settings = settings
        self._generation = generation
        self._since = since
        self._next = since + FIRST_EVERY
        self._carried = carried if carried is not None and carried.member else None
        self._last: dict[str, str] | None = None
        """The last round's nodes: node id -> how to name it (its address and id)."""

    def due_in(self, now: float) -> float:
        return max(0.0, self._next - now)

    async def say(self, now: float, joined: int, last_call: float | None, names: bool) -> None:
        """Say where the wait stands, if it is time; ``names``: say who is missing."""
        if now < self._next:
            return
        waited = now - self._since
        self._next = now + (FIRST_EVERY if waited < FIRST_FOR else THEN_EVERY)
        settings = self._settings
        if last_call is not None:
            until = f"sealing at the last call in {max(0.0, last_call - now):.0f}s"
        else:
            left = max(0.0, settings.join_timeout - waited)
            until = f"waiting for at least {settings.min_nodes} (join timeout in {left:.0f}s)"
        missing = await self._missing(joined) if names else ""
        log.info(
            "Rendezvous %s: round %d: %d of %d..%d node(s) joined in %.0fs; %s%s",
            self._run_id,
            self._generation,
            joined,
            settings.min_nodes,
            settings.max_nodes,
            waited,
            until,
            missing,
        )

    async def _missing(self, joined: int) -> str:
        """``; not back yet from round G: host (node), ...`` ('' when none or unknown)."""
        carried = self._carried
        if carried is None:
            return ""
        keys, store = self._keys, self._store
        if self._last is None:
            entries = [keys.round(carried.generation, f"node/{i}") for i in range(carried.size)]
            self._last = dict(map(_named, filter(None, await store.multi_get(entries))))
        arrivals = [keys.round(self._generation, f"node/{i}") for i in range(joined)]
        here = {_named(raw)[0] for raw in await store.multi_get(arrivals) if raw}
        absent = [node for node in self._last if node not in here]
        markers = [keys.round(carried.generation, f"gone/{node}") for node in absent]
        gone = await store.multi_get(markers) if markers else []
        missing = [self._last[node] for node, mark in zip(absent, gone, strict=True) if not mark]
        if not missing:
            return ""
        more = f" and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
        named = ", ".join(missing[:NAMED])
        return f"; not back yet from round {carried.generation}: {named}{more}"


def _named(raw: bytes) -> tuple[str, str]:
    """A round entry's node id, and the node as a person names it: ``host (node id)``."""
    entry = json.loads(raw)
    node = str(entry.get("node", "?"))
    addr = entry.get("addr")
    return node, f"{addr} ({node})" if addr else node
