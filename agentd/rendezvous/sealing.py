"""Sealing a round: reading its members' entries once and writing their summary, early when
everyone expected is in (:mod:`agentd.rendezvous.accounting`), and settling a round after
a member left for good. A mixin of :class:`~agentd.rendezvous.rounds.Rounds`."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from agentd.rendezvous import accounting, forgotten
from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.api import RendezvousClosedError, RendezvousStateError
from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.exclusions import exclusions_of
from agentd.rendezvous.summary import decode, encode, summarize
from agentd.store.api import StoreError, StoreTimeout

if TYPE_CHECKING:
    from agentd.rendezvous.keys import RunKeys
    from agentd.rendezvous.membership import Membership
    from agentd.rendezvous.round import Round, RoundSettings
    from agentd.store.api import Store

log = logging.getLogger(__name__)

LOOK_BACK = 2
"""Rounds before a new one searched for the last sealed one (older ones are deleted)."""
ENDED = b"0"
"""The ``sealed`` value of a round that ended before it was sealed."""
FENCE_CHECK = 0.25
"""How often a sealer waiting on an absent member's workers looks again."""


class Sealing:
    """Sealing and settling rounds (state lives on :class:`~agentd.rendezvous.rounds.Rounds`)."""

    _run_id: str
    _store: Store
    _keys: RunKeys
    _settings: RoundSettings
    _membership: Membership | None
    carried: Carried | None
    _node: dict[str, object]
    finished_peers: tuple[int, frozenset[str]] = (-1, frozenset())
    """Members of a round whose workers this agent's round watch saw succeed (their
    heartbeat went with their ``done`` key set), and that round."""

    @property
    def node_id(self) -> str:
        """This node's id, as its entries name it."""
        return str(self._node["node"])

    if TYPE_CHECKING:

        async def generation(self) -> int: ...

        async def advance(self, generation: int, reason: str) -> None: ...

    async def _seal_if_counted(
        self, generation: int, carried: Carried
    ) -> tuple[bytes | None, bool]:
        """Count this agent in round ``generation`` and seal it if everyone expected is in;
        also whether this agent is the first member back (it checks the missing ones'
        leases while it waits)."""
        arriving = self.node_id if carried.member else None
        counted = await accounting.count(self._store, self._keys, generation, carried, arriving)
        first_back = carried.member and counted.back == 1
        return await self._seal_counted(generation, carried, counted), first_back

    async def _seal_counted(
        self, generation: int, carried: Carried, counted: accounting.Count
    ) -> bytes | None:
        settings = self._settings
        if not counted.complete(carried, settings.min_nodes, settings.max_nodes):
            return None
        log.info(
            "Rendezvous %s: round %d has every node expected (%d of round %d's %d back, "
            "%d gone, %d waited); sealing it",
            self._run_id,
            generation,
            counted.back,
            carried.generation,
            carried.size,
            counted.gone,
            counted.waiting,
        )
        return await self._seal(generation, min(counted.joined, settings.max_nodes))

    async def _settle_count(self, generation: int) -> bytes | None:
        """Count round ``generation`` again (nobody arriving) and seal it if it is complete."""
        carried = self.carried
        if carried is None:
            return None
        counted = await accounting.count(self._store, self._keys, generation, carried, None)
        return await self._seal_counted(generation, carried, counted)

    async def gone_marks(self) -> dict[str, bytes]:
        """The members of our last round this store holds marked gone, with their marks:
        what a store's host hands over with the store (:meth:`settle`)."""
        carried = self.carried
        if carried is None or not carried.member:
            return {}
        nodes = await accounting.members(self._store, self._keys, carried)
        keys = [self._keys.round(carried.generation, f"gone/{node}") for node in nodes]
        return {n: m for n, m in zip(nodes, await self._store.multi_get(keys), strict=True) if m}

    async def settle(
        self, node: str, marked: dict[str, bytes] | None = None, round_goes_on: bool = False
    ) -> None:
        """``node``, a member of our last round, left for good: mark it gone, and seal the
        round being joined now if that completes its count (nothing to do once the
        rendezvous is closed). For a leaving agent and its guardian. ``marked``: the
        members an earlier store held marked gone (:meth:`gone_marks`), marked again here:
        a store's host that hands it over as others leave too carries their marks, which
        the new store would otherwise learn only when its fence for the round ends (20 s,
        three of five agents stopped at once). ``round_goes_on``: the leave does not end
        our round (our workers succeeded), so the generation is only read: a store behind
        our floor is not moved on (:meth:`generation`), which ended the round (in round 0,
        whose generation no key holds, every time)."""
        carried = self.carried
        if carried is None or not carried.member:
            return
        for other, mark in (marked or {}).items():
            lapsed = mark == accounting.LAPSED
            await accounting.mark_gone(self._store, self._keys, carried, other, lapsed)
        await accounting.mark_gone(self._store, self._keys, carried, node)
        if round_goes_on:
            await self._settle_later_round(carried)
            return
        try:
            generation = await self.generation()
        except RendezvousClosedError:
            return
        if generation > carried.generation:
            await self._settle_count(generation)

    async def count_finished(self, node: str, generation: int) -> None:
        """``node``'s workers succeeded in round ``generation``, our last (it waits in its
        exit barrier): count it as not coming back (:func:`accounting.mark_done`), and seal
        a later round being joined now if that completes its count."""
        carried = self.carried
        if carried is None or not carried.member or carried.generation != generation:
            return
        await accounting.mark_done(self._store, self._keys, carried, node)
        await self._settle_later_round(carried)

    async def carry_finished(self, carried: Carried) -> None:
        """Count the members of ``carried``'s round that we saw finish as finished in this
        store too (once each, whatever was counted before): a store that failed over
        forgot them, and the next round's fence waited a lease for each (seed 2381 of
        ``bench/simulate.py --failover``: a finished host lost whole, then the member it
        had handed the store to killed: 20 s)."""
        generation, nodes = self.finished_peers
        if generation == carried.generation:
            for node in sorted(nodes):
                await accounting.mark_done(self._store, self._keys, carried, node)

    async def _settle_later_round(self, carried: Carried) -> None:
        """Count again a round after ``carried``'s being joined now, if any (the run not
        closed), reading the generation without moving it (:meth:`generation` would)."""
        raw, closed = await self._store.multi_get([self._keys.gen, self._keys.closed])
        if closed is None and int(raw or b"0") > carried.generation:
            await self._settle_count(int(raw or b"0"))

    async def _seal(self, generation: int, count: int, own: int | None = None) -> bytes | None:
        """Seal round ``generation`` with its first ``count`` arrivals as members: their
        summary, unless the round is sealed already. Returns the ``sealed`` value then.
        An arrival whose heartbeat the store no longer holds (it died after it arrived)
        ends the round instead (:data:`ENDED`): the others join the next one without it.
        ``own``: our place in the round; where the store lacks our entry, it lost the
        round (it failed over or restarted since we arrived): None, at once, where waiting
        for the entries it lacks cost the entry timeout (seed 25946 of ``bench/simulate.py
        --failover``: 15 s, the failover between the last call's count and the seal)."""
        store, keys = self._store, self._keys
        last = await self._last_sealed(generation)  # (generation, size): two reads at most
        if last is None:  # the store's first seal: it may have forgotten a round (S1)
            membership = self._membership
            ttl = membership.ttl if membership is not None else RendezvousSettings().heartbeat_ttl
            held = await forgotten.hold(store, keys, self._run_id, generation, ttl)
            if held is not None:
                return held
        sealed_key = keys.round(generation, "sealed")
        entries = [keys.round(generation, f"node/{i}") for i in range(count)]
        sealed, *values = await store.multi_get([sealed_key, *entries])
        if sealed is not None:
            return sealed
        if own is not None and values[own] is None:
            return None
        missing = [key for key, value in zip(entries, values, strict=True) if value is None]
        if missing:  # arrivals between their add and their entry
            try:
                await store.wait(missing, self._settings.entry_timeout)
            except StoreTimeout:
                timeout = self._settings.entry_timeout
                return await self._end_unsealed(
                    generation, f"{len(missing)} arrival(s) wrote no entry within {timeout:g}s"
                )
            values = await store.multi_get(entries)
        nodes = [json.loads(value or b"{}") for value in values]
        ids = [str(node.get("node")) for node in nodes]
        beats = await store.multi_get([keys.heartbeat(node) for node in ids])
        expired = [node for node, beat in zip(ids, beats, strict=True) if beat is None]
        if expired:  # S2: a member's lease must be live at the store that seals its round
            return await self._end_unsealed(
                generation,
                f"the heartbeat of {len(expired)} arrival(s) expired before the seal "
                f"({_few(expired)})",
            )
        excluded: dict[str, Any] = {}
        if last is not None:
            members = await self._node_ids(*last)
            absent = {rank: node for rank, node in enumerate(members) if node not in ids}
            if absent:
                held = await self._fence(generation, last[0], absent)
                if held is not None:
                    return held
                excluded = await self._exclusions(list(absent.values()))
        # S2 in one step: the seal is refused by a store that lacks an arrival's entry or
        # heartbeat now (one that restarted empty since the reads above, or to which the
        # seal was resent)
        placed, held = await store.compare_set(
            sealed_key,
            None,
            encode(summarize(nodes, excluded)),
            present=[*entries, *(keys.heartbeat(node) for node in ids)],
        )
        if not placed and held is None:
            return await self._end_unsealed(
                generation,
                "an arrival's entry or heartbeat was gone from the store as the round was sealed "
                "(it restarted, or the lease expired)",
            )
        return held

    async def _end_unsealed(self, generation: int, reason: str) -> bytes | None:
        """End round ``generation`` before it is sealed (:meth:`advance`); its ``sealed``
        value then: :data:`ENDED`, or the seal another agent made first."""
        await self.advance(generation, reason)
        return await self._store.get(self._keys.round(generation, "sealed"))

    async def _fence(self, generation: int, last: int, absent: dict[int, str]) -> bytes | None:
        """S1: wait until no worker of ``absent`` (group rank -> node id), members of round
        ``last`` missing from round ``generation``, can still be running: each stopped its
        workers (it joined a later round or stepped out: ``out``), left or was released
        (``gone``), saw its workers succeed (``done``: in the exit barrier), or its
        heartbeat has been missing for :data:`~agentd.rendezvous.accounting.FENCE` (its
        guardian killed them). A round filled by spares while a member is frozen or cut off
        waits here, at most that member's lease and the fence. Returns the ``sealed`` value
        if another agent sealed or ended the round meanwhile, :data:`ENDED` once the store
        is at another round (it moved on, or it failed over or restarted and forgot this
        one, which nobody will seal or end there), and None: seal it."""
        store, keys = self._store, self._keys
        sealed_key = keys.round(generation, "sealed")
        missing_since: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        waited = False
        while True:
            reads = [sealed_key, keys.gen]
            for rank, node in absent.items():  # three ways to be done with the workers
                reads += [keys.round(last, f"{mark}/{node}") for mark in ("out", "gone")]
                reads += [keys.round(last, f"done/{rank}"), keys.heartbeat(node)]
            sealed, current, *values = await store.multi_get(reads)
            if sealed is not None:
                return sealed
            if int(current or b"0") != generation:  # seed 27581 of --failover waited forever
                return ENDED
            now = loop.time()
            waiting = []
            for i, node in enumerate(absent.values()):
                *stopped, beat = values[4 * i : 4 * i + 4]
                if any(mark is not None for mark in stopped):
                    continue
                if beat is not None:
                    missing_since.pop(node, None)
                elif now - missing_since.setdefault(node, now) >= accounting.FENCE:
                    continue
                waiting.append(node)
            if not waiting:
                return None
            if not waited:
                waited = True
                log.info(
                    "Rendezvous %s: round %d waits until %s of round %d can run no worker",
                    self._run_id,
                    generation,
                    _few(waiting),
                    last,
                )
            await asyncio.sleep(FENCE_CHECK)

    async def member_ids(self, current: Round) -> list[str]:
        """The node ids of ``current``'s members, by group rank: N entries read, for the
        rare uses that need them all (a drain, the serving agent's departure)."""
        return await self._node_ids(current.generation, current.size)

    async def spare_ids(self, current: Round) -> list[str]:
        """The node ids of the spares that waited beside ``current`` once it was full."""
        carried = Carried(current.generation, current.size, True)
        return await accounting.spares(self._store, self._keys, carried)

    async def last_spare_ids(self) -> list[str]:
        """The node ids of the spares that waited beside the last round sealed (for a node
        with no round of its own)."""
        latest = int(await self._store.get(self._keys.gen) or b"0")
        sealed = await self._last_sealed(latest + 1)
        if sealed is None:
            return []
        carried = Carried(sealed[0], sealed[1], True)
        return await accounting.spares(self._store, self._keys, carried)

    async def _node_ids(self, generation: int, size: int) -> list[str]:
        keys = [self._keys.round(generation, f"node/{i}") for i in range(size)]
        return [str(json.loads(v)["node"]) for v in await self._store.multi_get(keys) if v]

    async def _last_sealed(self, generation: int) -> tuple[int, int] | None:
        """The last round sealed before ``generation`` (within :data:`LOOK_BACK`) and its
        size; None for none."""
        for earlier in range(generation - 1, max(-1, generation - 1 - LOOK_BACK), -1):
            sealed = await self._store.get(self._keys.round(earlier, "sealed"))
            if sealed is not None and sealed != ENDED:
                try:
                    return earlier, decode(sealed).size
                except (RendezvousStateError, ValueError, KeyError):
                    return None
        return None

    async def _exclusions(self, gone: list[str]) -> dict[str, Any]:
        """The exclusions of ``gone``, members of the last round missing from the new one.
        Store trouble costs the report, never the round."""
        try:
            return await exclusions_of(self._store, self._keys, sorted(gone))
        except (StoreError, RendezvousStateError, ValueError, KeyError) as exc:
            log.debug("Rendezvous %s: could not read exclusions: %s", self._run_id, exc)
        return {}


def _few(names: list[str]) -> str:
    """The first three of ``names`` for a log line, and ``...`` for the rest."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
