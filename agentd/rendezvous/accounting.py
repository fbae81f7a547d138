"""Sealing a round as soon as everyone expected is in: the last sealed round's members
each back or gone for good, and the nodes that waited for a place.

A node remembers the last sealed round it saw (:class:`Carried`): the one it was a member
of, or the one it arrived too late for. When it joins a later round it counts itself
back (one ``add_once`` on ``round/<g>/back/<G>``, marked ``round/<g>/back/<G>/<node>``,
for a member) and reads three counters;
when the count adds up it seals the round at once, instead of waiting for the last
call. A member that leaves for good (SIGTERM, a drain, ``agentd drain``, its guardian
after a SIGKILL, or its lease found expired) is marked gone once, by whoever notices
first (``round/<G>/gone/<node>`` and ``round/<G>/gone`` in one ``add_once``, which a
lost answer resends safely), and the marker checks the count again: of two nodes that
each change a counter and then read the other's, the later one sees both, so no last
change goes unnoticed.

A round seals early when:

- every member of round G is back or gone: ``back >= size(G) - gone(G)``, and
- the round holds the nodes that waited for a place after G was sealed (spares, a
  growing world): ``joined >= min(max, expected + waiting)``, and at least ``min``.

Each node makes O(1) requests for this, whatever the job's size. The one exception is the
first member back, which checks once a second, while the count is short, that the
missing members still hold their leases (one read of N heartbeats): a lost host with no
guardian left is marked gone :data:`FENCE` after its lease expires, not a last call later.
It checks the spares' leases too: a spare names itself as it waits
(``round/<G>/spare/<place>``), and one whose lease lapsed is no longer waited for
(``round/<G>/spares_gone``): a spare's host lost while it waited cost the next round its
last call (seed 26183 of ``bench/simulate.py --failover``: 30 s, when a member left 40 s
later).

A member whose workers succeeded (it waits in its exit barrier, and never runs again) is
counted too, as it writes its ``done`` key: in ``round/<G>/done`` by the same marker
(``round/<G>/gone/<node>``, :data:`DONE`), so that a leave or a lapse after it counts
nothing twice, and ``round/<G>/gone`` still counts only the members that left (the
departures :meth:`~agentd.rendezvous.roll_call.RollCalls.departed` reads). A restart after
one member had finished waited for it until the last call (30 s).

The last call still decides where nobody can know who is coming: the first round, and a
round whose count never adds up (a member that joined and died before sealing).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store

log = logging.getLogger(__name__)

CHECK_INTERVAL = 1.0
"""How often the first member back checks the missing members' leases."""
FENCE = 1.0
"""How long a member's heartbeat must have been seen missing before it is counted gone.
Its guardian kills its workers at most the guardian's slack (0.5 s,
``agentd.hygiene.guardian_process.LEASE_SLACK``) after the store let the heartbeat
expire, so its ranks are given to others only once no worker of its can be alive."""


class Carried(NamedTuple):
    """The last sealed round a node saw: whose members the next round expects."""

    generation: int
    size: int
    member: bool
    """This node was one of its members (else it arrived after the round was sealed)."""
    instance: str | None = None
    """The store server instance it was seen sealed in (None: not known)."""


class Count(NamedTuple):
    """Round ``g``'s count against the members of round ``G`` (:class:`Carried`)."""

    back: int
    gone: int
    """Members that left for good, or finished (:data:`DONE`)."""
    joined: int
    waiting: int

    def complete(self, carried: Carried, min_nodes: int, max_nodes: int) -> bool:
        expected = carried.size - self.gone
        target = max(min_nodes, min(max_nodes, expected + self.waiting))
        return self.back >= expected and self.joined >= target


async def count_back(
    store: Store, keys: RunKeys, generation: int, carried: Carried, node: str
) -> int:
    """Count ``node``, a member of ``carried``'s round, back in round ``generation``, once
    (``add_once``: a join resumed after a lost answer counts nothing twice): how many are
    back now."""
    counter = keys.round(generation, f"back/{carried.generation}")
    return (await store.add_once(counter, f"{counter}/{node}", BACK))[1]


async def count(
    store: Store, keys: RunKeys, generation: int, carried: Carried, arriving: str | None
) -> Count:
    """Round ``generation``'s count (counting node ``arriving`` back first, if given)."""
    back_key = keys.round(generation, f"back/{carried.generation}")
    back = None
    if arriving is not None:
        back = await count_back(store, keys, generation, carried, arriving)
    raw = await store.multi_get(
        [
            back_key,
            keys.round(carried.generation, MEMBERS),
            keys.round(generation, "join"),
            keys.round(carried.generation, "join"),
            keys.round(carried.generation, SPARES),
            keys.round(carried.generation, FINISHED),
        ]
    )
    read_back, gone, joined, late, spares_gone, done = (int(value or b"0") for value in raw)
    return Count(
        back if back is not None else read_back,
        gone + done,
        joined,
        max(0, late - carried.size - spares_gone),
    )


LEFT, LAPSED, DONE = b"left", b"lapsed", b"done"
"""Why a node was counted gone: it said it left (itself, or its guardian), or its lease
was seen not held; or done: its workers succeeded (counted in :data:`FINISHED`)."""
BACK = b"back"
"""The mark of a member counted back."""
MEMBERS = "gone"
SPARES = "spares_gone"
FINISHED = "done"
"""The counters of ``carried``'s round that :func:`mark_gone` adds to."""


async def mark_gone(
    store: Store,
    keys: RunKeys,
    carried: Carried,
    node: str,
    lapsed: bool = False,
    counter: str = MEMBERS,
) -> bool:
    """Count ``node``, a member of ``carried``'s round (or, with ``counter`` SPARES, a
    spare that waited after it), gone for good, once, in one step (``add_once``: a
    resend after a lost answer counts nothing twice); whether it was counted for this
    reason (by this call, by an earlier one, or by another caller for the same reason:
    a count made twice costs nothing, one missed costs the round its last call).
    ``lapsed``: because its lease was not held: only where the store that takes the mark
    holds no heartbeat of it, in the same step (the lease was read in one store; a
    failover may carry the mark to another, where the node beats)."""
    marker = keys.round(carried.generation, f"{counter}/{node}")
    absent = [keys.heartbeat(node)] if lapsed else []
    total = keys.round(carried.generation, counter)
    placed, _ = await store.add_once(total, marker, LAPSED if lapsed else LEFT, absent)
    return placed


async def mark_done(store: Store, keys: RunKeys, carried: Carried, node: str) -> None:
    """Count ``node``, a member of ``carried``'s round whose workers succeeded, as not
    coming back (in :data:`FINISHED`), under its gone marker: once, whatever follows."""
    marker = keys.round(carried.generation, f"{MEMBERS}/{node}")
    await store.add_once(keys.round(carried.generation, FINISHED), marker, DONE)


class LeaseCheck:
    """The first member back's check of the missing members' leases while round
    ``generation`` fills: the last round's member list is read once, then their
    heartbeats at each check; a member whose heartbeat has been missing for :data:`FENCE`
    is counted gone.

    A store that forgot the last round (it failed over or restarted empty) holds neither
    its member list nor their leases: there, once the fence it keeps for that round
    (``ctl/forgotten``, see :mod:`agentd.rendezvous.forgotten`) has ended, no lease of the
    old store holds any more, and every member not back is counted gone at once. A fence
    that was never set has not ended: where the round's ``fenced`` mark is missing too,
    ``fence`` sets it (nobody who knew the round told the store before it moved on: seed
    46256 of ``bench/simulate.py --failover`` gave a live worker's rank away)."""

    def __init__(
        self,
        store: Store,
        keys: RunKeys,
        carried: Carried | None,
        generation: int,
        fence: Callable[[], Awaitable[None]],
    ) -> None:
        self._store, self._keys, self._carried = store, keys, carried
        self._generation = generation
        self._fence = fence
        self._nodes: list[str] | None = None
        self._spares: list[str] = []
        self._missing_since: dict[str, float] = {}

    async def marked(self, now: float) -> int:
        """Check once; how many members, or spares, were newly counted gone."""
        carried = self._carried
        if carried is None:
            return 0
        if self._nodes is None:
            self._nodes = await members(self._store, self._keys, carried)
            self._spares = await spares(self._store, self._keys, carried)
        if not self._nodes:
            return await self._forgotten_fence_passed(carried)
        store, keys, since = self._store, self._keys, self._missing_since
        gone = await mark_lapsed(store, keys, carried, self._nodes, since, now)
        if self._spares:
            gone += await mark_lapsed(store, keys, carried, self._spares, since, now, SPARES)
        return gone

    async def _forgotten_fence_passed(self, carried: Carried) -> int:
        keys = self._keys
        back_key = keys.round(self._generation, f"back/{carried.generation}")
        fence, fenced, back, gone, done = await self._store.multi_get(
            [
                keys.forgotten,
                keys.round(carried.generation, "fenced"),
                back_key,
                keys.round(carried.generation, "gone"),
                keys.round(carried.generation, FINISHED),
            ]
        )
        missing = carried.size - sum(int(n or b"0") for n in (back, gone, done))
        if fence is not None or missing <= 0:
            return 0
        if fenced is None:
            await self._fence()
            return 0
        await self._store.add(keys.round(carried.generation, "gone"), missing)
        log.info(
            "Rendezvous: the store forgot round %d, and its fence has ended: the %d member(s) "
            "not back are gone",
            carried.generation,
            missing,
        )
        return missing


async def members(store: Store, keys: RunKeys, carried: Carried) -> list[str]:
    """The node ids of ``carried``'s round (N entries read, once per waiting round)."""
    entries = [keys.round(carried.generation, f"node/{i}") for i in range(carried.size)]
    return [str(json.loads(v)["node"]) for v in await store.multi_get(entries) if v]


async def spares(store: Store, keys: RunKeys, carried: Carried) -> list[str]:
    """The node ids of the spares that waited after ``carried``'s round was full."""
    late = int(await store.get(keys.round(carried.generation, "join")) or b"0")
    places = range(carried.size, late)
    named = await store.multi_get([keys.round(carried.generation, f"spare/{i}") for i in places])
    return [value.decode() for value in named if value]


async def mark_lapsed(
    store: Store,
    keys: RunKeys,
    carried: Carried,
    nodes: list[str],
    missing_since: dict[str, float],
    now: float,
    counter: str = MEMBERS,
    fence: float = FENCE,
) -> int:
    """Mark gone (in ``counter``) every node of ``nodes`` whose heartbeat (lease) has been
    missing for ``fence`` seconds, as seen by the calls so far (``missing_since``: when
    each was first seen missing, kept by the caller); how many were newly marked."""
    beats = await store.multi_get([keys.heartbeat(node) for node in nodes])
    marked = 0
    for node, beat in zip(nodes, beats, strict=True):
        if beat is not None:
            missing_since.pop(node, None)
            continue
        since = missing_since.setdefault(node, now)
        if now - since >= fence and await mark_gone(store, keys, carried, node, True, counter):
            log.info(
                "Rendezvous: %s %s of round %d is gone (its lease is not held)",
                "node" if counter == MEMBERS else "spare",
                node,
                carried.generation,
            )
            marked += 1
    return marked
