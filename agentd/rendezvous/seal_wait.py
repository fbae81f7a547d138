"""Waiting in a joined round until it is sealed: the seal at once where our arrival fills
the round or completes its count, else a watch on its ``sealed`` key until another
agent seals it, the last call (where this agent seals it), or the round goes away (the
store lost it, or its generation moved on unsealed). The mechanics of
:class:`~agentd.rendezvous.rounds.Rounds` (its state lives there)."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from agentd.rendezvous import accounting, forgotten
from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.round import Round
from agentd.rendezvous.sealing import ENDED, Sealing
from agentd.rendezvous.summary import RoundSummary, decode
from agentd.rendezvous.waiting import WaitReport

if TYPE_CHECKING:
    from agentd.rendezvous.membership import Membership
    from agentd.store.api import Store

log = logging.getLogger(__name__)

_STORE_LOST_ROUND = (
    "Rendezvous %s: round %d went with the store's old state (it restarted or failed "
    "over); joining the next round"
)

POLL = 60.0
"""Longest single watch; the servers cap long polls at a minute."""
UNSURE_POLL = 0.5
"""How often a node unsure of its last round asks for the store's record of it."""
MISSED_LOOKBACK = 8
"""How many of the rounds before the one we join :meth:`SealWait.missed_rounds` reads."""


def incarnation_of(store: Store) -> int:
    """Which server the store's client talks to (:attr:`~agentd.store.http_client.HttpStore.
    incarnation`: one more at each restart or failover; 0 for a store never replaced)."""
    return int(getattr(store, "incarnation", 0))


def instance_of(store: Store) -> str | None:
    """The server instance that answered the store's client last (:attr:`~agentd.store.
    http_client.HttpStore.instance`; None: not known, or a store that is never replaced)."""
    instance = getattr(store, "instance", None)
    return instance if isinstance(instance, str) else None


class SealWait(Sealing):
    """Waiting for a round's seal (state lives on :class:`~agentd.rendezvous.rounds.Rounds`)."""

    _membership: Membership | None
    unsure: tuple[int, int, str] | None
    _unsure_until: float
    sat_out: bool

    if TYPE_CHECKING:

        async def wait_for_generation_after(
            self, generation: int, full: int | None = None
        ) -> None: ...

    async def _until_sealed(
        self,
        generation: int,
        rank: int,
        mine: bytes,
        start: int,
        incarnation: int,
        instance: str | None = None,
    ) -> Round | None:
        """Wait in round ``generation`` (our entry ``mine`` at ``rank``, written in the store
        of ``incarnation``, at the server ``instance``) until it is sealed: the round, or
        None (try the next)."""
        settings = self._settings
        sealed, revision, checker = None, start, False
        carried = self.carried
        if rank + 1 == settings.max_nodes:
            if carried is not None and carried.member and carried.generation < generation:
                # a store that forgot our last round waits for its members to be back
                await accounting.count_back(
                    self._store, self._keys, generation, carried, self.node_id
                )
            sealed = await self._seal(generation, settings.max_nodes, rank)
        elif carried is not None and carried.generation < generation:
            sealed, checker = await self._seal_if_counted(generation, carried)
        elif carried is None and (before := await self._round_before(generation)) is not None:
            sealed, _ = await self._seal_if_counted(generation, before)
        if sealed is None:
            sealed, revision = await self._wait_for_seal(generation, rank, mine, start, checker)
            if sealed is None:
                await self._carry_if_forgotten_with_us(generation, rank, instance)
                return None
        if incarnation_of(self._store) != incarnation and not await self._holds(
            generation, rank, mine
        ):  # the store failed over while we waited: the seal read since is the new store's,
            # of a round of the same number where our place is another node's (seed 5779 of
            # ``bench/simulate.py --failover``: two workers of one rank)
            log.info(_STORE_LOST_ROUND, self._run_id, generation)
            await self._carry_if_forgotten_with_us(generation, rank, instance)
            return None
        summary = None if sealed == ENDED else decode(sealed)
        if summary is None or rank >= summary.size:
            await self._arrived_late(generation, sealed)
            return None
        self.carried = Carried(generation, summary.size, True, instance_of(self._store))
        self.unsure = None  # a round sealed with us: the one before no longer matters
        assert self._membership is not None
        lapsed = self._membership.lapsed()
        if lapsed or self._membership.dropped:  # paused or cut off as the round sealed: the
            why = "ran out" if lapsed else "expired at the store"  # others may have our ranks
            log.warning(
                "Rendezvous %s: round %d was sealed with this node, but its lease %s "
                "meanwhile; ending it without starting workers",
                self._run_id,
                generation,
                why,
            )
            await self.advance(generation, f"node {self.node_id}'s lease {why}")
            return None
        return Round(generation, rank, summary, revision, mine)

    async def _arrived_late(self, generation: int, sealed: bytes | None) -> None:
        """Round ``generation`` was ended, or ``sealed`` without us: wait for the next
        round, ending this one to be admitted where it has room."""
        if sealed is None:  # moved away from under us (the store failed over): join again
            return
        if sealed == ENDED:
            log.info(
                "Rendezvous %s: round %d ended before it was sealed; joining the next",
                self._run_id,
                generation,
            )
            await self._move_past_ended(generation)
            return
        log.info(
            "Rendezvous %s: arrived after round %d was sealed; waiting for the next",
            self._run_id,
            generation,
        )
        size = decode(sealed).size
        self.carried = Carried(generation, size, False, instance_of(self._store))
        self.sat_out = True  # its ranks may train on before it ends: see kept_workers.py
        if size < self._settings.max_nodes:  # there is room: end the round to admit us
            await self.advance(generation, f"node {self.node_id} wants to join")
            await self.wait_for_generation_after(generation)
        else:
            await self.wait_for_generation_after(generation, full=size)

    async def missed_rounds(self, generation: int) -> bool:
        """Whether a round was sealed after the last one we were a member of and before
        ``generation`` (the last :data:`MISSED_LOOKBACK` of them): its ranks trained on
        without ours, as where our lease lapsed and the round went on before we were back
        (a node counted gone, or frozen). A round the store forgot (it restarted, or
        failed over) counts where its fence still names it (``ctl/forgotten``), else it
        cannot be known. A round we arrived at after its seal (:meth:`_arrived_late`), or
        sat out full, says so itself. One request, none where we join the round after
        ours."""
        carried = self.carried
        if carried is None or not carried.member:
            return False
        first = max(carried.generation + 1, generation - MISSED_LOOKBACK)
        if first >= generation:
            return False
        keys = [self._keys.round(g, "sealed") for g in range(first, generation)]
        *seals, record = await self._store.multi_get([*keys, self._keys.forgotten])
        lost = forgotten.Forgotten.decode(record) if record is not None else None
        if lost is not None and carried.generation < lost.generation < generation:
            return True
        return any(seal not in (None, ENDED) for seal in seals)

    async def _round_before(self, generation: int) -> Carried | None:
        """For a node new to the job: round ``generation`` - 1, where it was sealed in
        this store or is the round the store forgot (``ctl/forgotten``), as a round we
        were not in. Our arrival may complete the count of the round being joined: its
        members are back or gone, and only the minimum was missing. A replacement
        for a lost node of a ``2:4`` job of two waited for the last call (30 s), the
        count complete but for its arrival, which it did not count."""
        if generation == 0:
            return None
        keys = self._keys
        sealed, record = await self._store.multi_get(
            [keys.round(generation - 1, "sealed"), keys.forgotten]
        )
        summary = decode(sealed) if sealed is not None and sealed != ENDED else None
        if summary is not None:
            return Carried(generation - 1, summary.size, False)
        lost = forgotten.Forgotten.decode(record) if record is not None else None
        if lost is not None and lost.generation == generation - 1:
            return Carried(lost.generation, lost.size, False)
        return None

    async def _move_past_ended(self, generation: int) -> None:
        """Round ``generation`` is marked ended: move the generation past it where that
        did not happen. The two are written one after the other, and a failover between
        them (the mark resent to the new server, the generation's move applied to the
        old one) left a new store at an ended round, which every agent joined again and
        again until it was full (seed 42455 of ``bench/simulate.py --failover``). The
        generation moves only from ``generation`` (:meth:`advance`), so this is a no-op
        where it moved already."""
        await self.advance(generation, "it was marked ended, but the generation had not moved")

    async def _holds(self, generation: int, rank: int, mine: bytes) -> bool:
        """Whether the store holds our entry ``mine`` at ``rank`` of round ``generation``."""
        return await self._store.get(self._keys.round(generation, f"node/{rank}")) == mine

    async def _wait_for_seal(
        self, generation: int, rank: int, mine: bytes, revision: int, checker: bool = False
    ) -> tuple[bytes | None, int]:
        """The round's ``sealed`` value once it is set, and the last revision seen while
        waiting; None if the round went away meanwhile (the store lost it, or its
        generation moved on and nobody sealed it). The ``checker`` (the first member of
        the last round back) marks members whose lease lapsed gone, once a second."""
        store, settings = self._store, self._settings
        sealed_key = self._keys.round(generation, "sealed")
        loop = asyncio.get_running_loop()
        last_call = (
            loop.time() + settings.last_call_timeout if rank + 1 >= settings.min_nodes else None
        )
        log.info(
            "Rendezvous %s: joined round %d as node %d; waiting for %d..%d node(s)",
            self._run_id,
            generation,
            rank,
            settings.min_nodes,
            settings.max_nodes,
        )
        sealed: bytes | None = None  # the watch from our join on returns a seal already made
        report = WaitReport(
            self._run_id, store, self._keys, settings, generation, loop.time(), self.carried
        )
        joined = rank + 1
        leases = None
        if checker and (carried := self.carried) is not None and self._membership is not None:
            ttl = self._membership.ttl
            fence = functools.partial(forgotten.remember, store, self._keys, carried, ttl)
            leases = accounting.LeaseCheck(store, self._keys, carried, generation, fence)
        next_check = loop.time()
        while sealed is None:
            await report.say(loop.time(), joined, last_call, names=checker)
            timeout = report.due_in(loop.time())
            if last_call is not None:
                timeout = min(timeout, max(0.0, last_call - loop.time()))
            unsure = self.unsure is not None and self.unsure[0] < generation
            if unsure and loop.time() < self._unsure_until:
                timeout = min(timeout, UNSURE_POLL)  # the record may come after our join
                sealed = await self._count_back_if_told(generation)
                if sealed is not None:
                    break
            if leases is not None:
                if loop.time() >= next_check:
                    next_check = loop.time() + accounting.CHECK_INTERVAL
                    if await leases.marked(loop.time()):
                        sealed = await self._settle_count(generation)
                        if sealed is not None:
                            break
                timeout = min(timeout, max(0.0, next_check - loop.time()))
            result = await store.watch(sealed_key, revision, min(timeout, POLL))
            revision = result.revision
            if result.compacted:
                if not await self._holds(generation, rank, mine):
                    log.info(_STORE_LOST_ROUND, self._run_id, generation)
                    return None, revision
                sealed = await store.get(sealed_key)
            else:
                sealed = next((e.value for e in result.events if e.value is not None), None)
            if sealed is not None:
                break
            if not result.events and await self.generation() != generation:
                await self._carry_if_sealed_with_us(generation, rank)
                return None, revision  # ended by an agent that could not seal it (it died)
            if last_call is None or report.due_in(loop.time()) == 0:
                joined = int(await store.get(self._keys.round(generation, "join")) or 0)
                if last_call is None and joined >= settings.min_nodes:
                    last_call = loop.time() + settings.last_call_timeout
            if last_call is not None and loop.time() >= last_call:
                joined = int(await store.get(self._keys.round(generation, "join")) or 0)
                if joined <= rank:  # our own arrival is not counted: the store lost it
                    log.info(_STORE_LOST_ROUND, self._run_id, generation)
                    return None, revision
                sealed = await self._seal(generation, min(joined, settings.max_nodes), rank)
        return sealed, revision

    async def _count_back_if_told(self, generation: int) -> bytes | None:
        """Waiting in round ``generation`` unsure whether we were a member of a round the
        store forgot (:attr:`unsure`): ask the record again, and once it names us, count
        back here (and seal, if that completes the count). The member that writes the
        record may come after our join: where this node itself had moved the generation
        past that round (it found its entry gone as it sealed), the others waited for the
        fence (``tests/sim/test_failover.py``: 20 s)."""
        assert self.unsure is not None
        await self._carry_if_forgotten_with_us(*self.unsure)
        carried = self.carried
        if carried is None or not carried.member or carried.generation >= generation:
            return None
        sealed, _ = await self._seal_if_counted(generation, carried)
        return sealed

    async def _carry_if_sealed_with_us(self, generation: int, rank: int) -> None:
        """A round sealed with us and ended before we saw its seal (we were paused): we
        are one of its members, so the next round's sealer waits for our ``out``, which we
        write as we join it (:meth:`mark_out`); we never started its workers."""
        summary = await self._sealed_with(generation, rank)
        if summary is not None:
            self.carried = Carried(generation, summary.size, member=True)

    async def _sealed_with(self, generation: int, rank: int) -> RoundSummary | None:
        """Round ``generation``'s summary, where it was sealed with the node that held
        place ``rank`` in it (None: not sealed, ended, or sealed without it)."""
        sealed = await self._store.get(self._keys.round(generation, "sealed"))
        if sealed is None or sealed == ENDED:
            return None
        summary = decode(sealed)
        return summary if rank < summary.size else None

    async def _carry_if_forgotten_with_us(
        self, generation: int, rank: int, instance: str | None
    ) -> None:
        """The store forgot round ``generation`` while we waited for its seal (it failed
        over or restarted): if a member that saw it sealed told the new store so
        (:mod:`~agentd.rendezvous.forgotten`), in the server instance that gave us our
        place and with us among its members, we are one of them. We count ourselves back
        in the next round, as its other members do, and never started its workers; else
        the next round waited for the fence of a member it would never see back (seed
        25946 of ``bench/simulate.py --failover``: 17 s, its store's host stopped 50 ms
        after the seal). A member tells the store before it moves the generation on, so
        where no record is found yet, the next join asks again once the generation has
        moved past the round (:attr:`unsure`; seed 65153: the last call, 30 s), and asks
        while it waits in the next one, until the record could no longer name us (it
        lives :func:`~agentd.rendezvous.forgotten.lifetime`)."""
        before, self.unsure = self.unsure, None
        carried = self.carried
        if instance is None or (carried is not None and carried.generation >= generation):
            return
        raw = await self._store.get(self._keys.forgotten)
        record = forgotten.Forgotten.decode(raw) if raw is not None else None
        if record is None or record.generation < generation:
            self.unsure = (generation, rank, instance)
            if before != self.unsure and self._membership is not None:
                ttl = self._membership.ttl
                self._unsure_until = asyncio.get_running_loop().time() + forgotten.lifetime(ttl)
        elif record.sealed_with(generation, rank, instance):
            self.carried = Carried(generation, record.size, True, instance)
            log.info(
                "Rendezvous %s: round %d was sealed with this node before the store forgot "
                "it; counting back in the next round",
                self._run_id,
                generation,
            )
