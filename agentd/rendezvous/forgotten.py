"""S1 across a store that forgot the run: the fence a new store keeps for the round it lost.

A store that restarted empty, or a candidate that took it over, knows no lease and no
round. Without more, the agents that reach it first form a round there at once, while a
member of the last round that is frozen or cut off still runs its workers on the old
store's lease (seed 91 of ``bench/simulate.py``: a spare took rank 1 while the paused
member's worker held it). The first agent to find the store new tells it, before it
moves the generation on (:meth:`~agentd.rendezvous.rounds.Rounds.generation`), what it
forgot: the last sealed round that agent saw, its size and the server instance it was
sealed in, under ``ctl/forgotten``, a TTL key that lives for one lease, the guardian's
slack and the fence. No later lease granted by the old store can outlast it. A member
that never read the seal before the store forgot the round learns there that it was one
(it held a place below the size in that instance's round: :meth:`Forgotten.sealed_with`),
and counts back as the others do.

While that key lives, the first round sealed in the new store (the sealer finds no
sealed round before its own there) waits until every member of the forgotten round is
accounted for: back in this round (``round/<g>/back/<G>``) or gone for good
(``round/<G>/gone``, which a killed agent's guardian writes in the new store). A member
that never comes back costs the others one lease; one that does costs nothing.

Nodes that never saw the old round's seal, and fill a round of the new store before any
member reaches it, know nothing to fence. A standalone store started again on its port
tells them itself how long ago it last held leases (:mod:`agentd.store.amnesia`): their
first round waits until a lease of that time can have ended, or a member comes back with
the fence. A store restarted with no record of its own (another machine, another boot)
is as new.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import NamedTuple

from agentd.rendezvous.accounting import FENCE, FINISHED, MEMBERS, Carried
from agentd.rendezvous.keys import RunKeys
from agentd.store import amnesia
from agentd.store.api import Store
from agentd.store.contact import CUT_OFF

log = logging.getLogger(__name__)

GUARDIAN_SLACK = 0.5
"""How long after a lease's end its guardian may still be killing the workers
(``agentd.hygiene.guardian_process.LEASE_SLACK``, a layer above this one)."""
CHECK = 0.1
"""How often a sealer held by the fence counts again."""


class Forgotten(NamedTuple):
    """The last sealed round an agent saw before the store forgot the run, and the server
    instance it was sealed in (None: not known)."""

    generation: int
    size: int
    instance: str | None = None

    def encode(self) -> bytes:
        doc: dict[str, object] = {"generation": self.generation, "size": self.size}
        if self.instance is not None:
            doc["instance"] = self.instance
        return json.dumps(doc).encode()

    @staticmethod
    def decode(raw: bytes) -> Forgotten | None:
        try:
            doc = json.loads(raw)
            instance = doc.get("instance")
            return Forgotten(
                int(doc["generation"]),
                int(doc["size"]),
                instance if isinstance(instance, str) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def sealed_with(self, generation: int, place: int, instance: str | None) -> bool:
        """Whether round ``generation`` was sealed with the node that held ``place`` in it
        at the server ``instance``: this is that round, sealed in that instance, with
        more members than ``place`` (a sealed round's members hold its first places)."""
        return (
            instance is not None
            and self.instance == instance
            and self.generation == generation
            and place < self.size
        )


def lifetime(ttl: float) -> float:
    """How long the fence lives: past the end of any lease the old store granted, with
    the heartbeat TTL ``ttl``, and past its guardian's kill. An old store cut off from the
    others may have renewed its own agent's lease for up to
    :data:`~agentd.store.contact.CUT_OFF` after the others lost it."""
    return ttl + GUARDIAN_SLACK + FENCE + CUT_OFF


async def remember(
    store: Store, keys: RunKeys, carried: Carried, ttl: float, lives: float | None = None
) -> None:
    """Tell a store that forgot the run about ``carried``'s round (its members may still
    run workers on the old lease), unless it already holds a later one; then mark the
    round ``fenced`` (no TTL), so a fence that ended is told from one never set. The mark
    is set only where the fence is, in one step: a failover between the two (seed 47215
    of ``--failover``) would have left the mark alone in the next store. The fence lives
    :func:`lifetime` of the heartbeat TTL ``ttl``, or ``lives`` seconds where given."""
    mine = Forgotten(carried.generation, carried.size, carried.instance)
    held = await store.get(keys.forgotten)
    while True:
        known = Forgotten.decode(held) if held is not None else None
        if known is not None and known.generation >= mine.generation:
            break
        placed, held = await store.compare_set(
            keys.forgotten, held, mine.encode(), ttl=lifetime(ttl) if lives is None else lives
        )
        if placed:
            break
    fenced = keys.round(carried.generation, "fenced")
    await store.compare_set(fenced, None, b"1", present=[keys.forgotten])


async def hold(
    store: Store, keys: RunKeys, run_id: str, generation: int, ttl: float
) -> bytes | None:
    """S1: before round ``generation`` is sealed in a store that forgot the run, wait
    while its fence lives and a member of the forgotten round is unaccounted for; in a
    store that says it restarted (:mod:`agentd.store.amnesia`) with no fence of the run's
    yet, while a lease of the heartbeat TTL ``ttl`` its previous self granted may live.
    Returns the round's ``sealed`` value if another agent sealed or ended it meanwhile
    (None: seal it)."""
    sealed_key = keys.round(generation, "sealed")
    waited = False
    until: float | None = None  # loop time until which the store's word holds the seal
    loop = asyncio.get_running_loop()
    while True:
        sealed, raw, word = await store.multi_get([sealed_key, keys.forgotten, amnesia.KEY])
        if sealed is not None:
            return sealed
        forgotten = Forgotten.decode(raw) if raw is not None else None
        if forgotten is None:
            ago = amnesia.read_word(word)
            if ago is None:
                return None
            # each reading errs late (the word is up to EVERY old): the earliest end holds
            end = loop.time() - ago + amnesia.EVERY + lifetime(ttl)
            until = end if until is None else min(until, end)
            if loop.time() >= until:
                return None
            if not waited:
                waited = True
                log.info(
                    "Rendezvous %s: the store says it restarted, forgetting leases it "
                    "held %.1fs ago, and knows no round of the run; round %d waits %.1fs "
                    "for those leases to end, or for a member of the last round",
                    run_id,
                    ago,
                    generation,
                    until - loop.time(),
                )
            await asyncio.sleep(CHECK)
            continue
        back, gone, finished = await store.multi_get(
            [
                keys.round(generation, f"back/{forgotten.generation}"),
                keys.round(forgotten.generation, MEMBERS),
                keys.round(forgotten.generation, FINISHED),  # their workers exited: no rank
            ]
        )
        if sum(int(n or b"0") for n in (back, gone, finished)) >= forgotten.size:
            return None
        if not waited:
            waited = True
            log.info(
                "Rendezvous %s: the store forgot round %d (it restarted or failed over); "
                "round %d waits until its %d member(s) are back or gone, or their leases "
                "have ended",
                run_id,
                forgotten.generation,
                generation,
                forgotten.size,
            )
        await asyncio.sleep(CHECK)
