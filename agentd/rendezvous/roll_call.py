"""Who of a round still answers: a roll call through the store.

A node whose workers failed in a round of several nodes cannot tell from its workers alone
whether the failure was its own or a peer's: a rank whose peer vanished fails its
collective at once ("Connection reset by peer"), long before the peer's lease runs out.
So it calls the roll: it writes ``ctl/rollcall`` (JSON ``{"id", "gen", "by"}``), which every
member's round watch sees at once (it watches ``ctl/`` already) and answers under
``rollcall/<id>/<node>``, outside ``ctl/``, so that the answers wake nobody. A member that
does not answer within a second is a suspect, not yet lost: only its lease running out
(the round watch's "left (no heartbeat)") names it lost.

Members whose workers are done (waiting in the exit barrier, where they do not watch) are
not asked. Both keys expire (:data:`ANSWER_TTL`), so calls never pile up in the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import TYPE_CHECKING

from agentd.store.api import StoreError, StoreTimeout

if TYPE_CHECKING:
    from agentd.rendezvous.conf import RendezvousSettings
    from agentd.rendezvous.keys import RunKeys
    from agentd.rendezvous.round import Round
    from agentd.store.api import Store

log = logging.getLogger(__name__)

ANSWER_TTL = 60.0
"""Seconds a call and its answers stay in the store."""


class RollCalls:
    """The roll calls of :class:`~agentd.rendezvous.dynamic.DynamicRendezvous` (a mixin:
    the rendezvous holds the store, the keys and the current round)."""

    node_id: str
    settings: RendezvousSettings
    _keys: RunKeys
    _round: Round | None

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

    async def roll_call(self, wait: float) -> list[str]:
        """The other members of the current round that did not answer within ``wait``
        seconds (their node ids), those whose workers are done left out."""
        current = self._round
        if current is None or current.size < 2:
            return []
        keys, store, generation = self._keys, self.store, current.generation
        places = range(current.size)
        entries = await store.multi_get(
            [keys.round(generation, f"node/{i}") for i in places]
            + [keys.round(generation, f"done/{i}") for i in places]
        )
        asked = [
            str(json.loads(entry)["node"])
            for i, entry in enumerate(entries[: current.size])
            if entry is not None and i != current.rank and entries[current.size + i] is None
        ]
        if not asked:
            return []
        call = os.urandom(6).hex()
        answers = [keys.roll_answer(call, node) for node in asked]
        doc = {"id": call, "gen": generation, "by": self.node_id}
        await store.set(keys.rollcall, json.dumps(doc).encode(), ttl=ANSWER_TTL)
        with contextlib.suppress(StoreTimeout):  # who answered is read below
            await store.wait(answers, wait)
        heard = await store.multi_get(answers)
        return [node for node, answer in zip(asked, heard, strict=True) if answer is None]

    async def departed(self) -> int:
        """How many members of the current round left it for good (a leave, a drain, a
        guardian's release): one read of the round's ``gone`` count (0 when the store
        cannot say)."""
        current = self._round
        if current is None:
            return 0
        try:
            gone = await self.store.get(self._keys.round(current.generation, "gone"))
        except StoreError as exc:
            log.debug("Could not read who left round %d: %s", current.generation, exc)
            return 0
        return int(gone or b"0")

    async def finished(self) -> list[int]:
        """The group ranks of the current round's members whose workers succeeded (their
        ``done`` key: they wait in their exit barrier, or have left), which never run again
        (empty when the store cannot say). One read of the round's ``done`` keys."""
        current = self._round
        if current is None or current.size < 2:
            return []
        places = [i for i in range(current.size) if i != current.rank]
        try:
            done = await self.store.multi_get(
                [self._keys.round(current.generation, f"done/{i}") for i in places]
            )
        except StoreError as exc:
            log.debug("Could not read who finished round %d: %s", current.generation, exc)
            return []
        return [i for i, value in zip(places, done, strict=True) if value is not None]

    def min_nodes(self) -> int:
        """The fewest nodes the job runs with (``--nnodes MIN:MAX``)."""
        return self.settings.min_nodes


async def answer(store: Store, keys: RunKeys, call: bytes, current: Round) -> None:
    """Answer roll call ``call`` (the value of ``ctl/rollcall``) if it is for our round."""
    try:
        doc = json.loads(call)
        call_id, generation = str(doc["id"]), int(doc["gen"])
    except (ValueError, KeyError, TypeError):
        return  # not a call of ours: nothing to answer
    if generation != current.generation:
        return
    node = str(json.loads(current.mine)["node"])
    await store.set(keys.roll_answer(call_id, node), b"here", ttl=ANSWER_TTL)
