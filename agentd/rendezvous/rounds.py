"""Rounds: joining one, sealing it, waiting for it to be sealed, ending it.

The mechanics of :class:`~agentd.rendezvous.dynamic.DynamicRendezvous`'s rounds over a
store (keys in :mod:`agentd.rendezvous.keys`). Each agent does a fixed number of store
operations per round, whatever its size: it announces its heartbeat, reads the generation,
takes an arrival index with ``add``, writes its node entry and watches the one ``sealed``
key. The agent that seals the round reads every entry once and writes their summary
(:mod:`agentd.rendezvous.summary`) as the ``sealed`` value, so the others learn the whole
round from the watch event alone.

Generations only go forward: :meth:`Rounds.generation` never returns one below the
*floor*, the lowest generation this agent may join (one past the last round it was in,
and at least every generation it has read). A store without a generation, or behind
the floor, is moved forward to it, and the round it was at is marked ended.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from agentd.exceptions import StartError
from agentd.rendezvous import accounting, forgotten
from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.api import RendezvousStateError
from agentd.rendezvous.closed import SHARED_RUN_HINT, closed_error
from agentd.rendezvous.keys import SHARED_RUN_ID, RunKeys
from agentd.rendezvous.membership import Membership
from agentd.rendezvous.round import Round, RoundSettings
from agentd.rendezvous.seal_wait import POLL, SealWait, incarnation_of, instance_of
from agentd.rendezvous.sealing import ENDED
from agentd.rendezvous.static import reserve_port
from agentd.rendezvous.summary import decode
from agentd.store.api import Store, StoreUnavailable

log = logging.getLogger(__name__)

SPARE_CHECK = 5.0
"""How often a spare waiting beside a full round checks that its members still live."""


class Arrival(NamedTuple):
    """Our place in a round: its ``entry`` at ``rank``, the store's revision before we
    arrived (``start``), and the store's :attr:`~agentd.store.http_client.HttpStore.incarnation`
    then (0 where it has none: a store that is never replaced)."""

    generation: int
    rank: int
    entry: bytes
    start: int
    incarnation: int
    instance: str | None = None
    """The server instance that holds the entry (None: not known)."""


class Rounds(SealWait):
    """The rounds of run ``run_id`` on ``store``, as joined by the node described in
    ``node`` (id, role, worker count, address and master port, 0 for any free one). Without
    a ``membership`` it cannot join, only settle (:mod:`agentd.rendezvous.release`)."""

    def __init__(
        self,
        run_id: str,
        store: Store,
        keys: RunKeys,
        settings: RoundSettings,
        membership: Membership | None,
        node: dict[str, Any],
        stand_by: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        """``stand_by``: once the store has answered us, where we stand by for it (''
        nowhere); our entries name it (see :mod:`agentd.store.standby`)."""
        self._run_id = run_id
        self._store = store
        self._keys = keys
        self._settings = settings
        self._membership = membership
        self._node = node
        self._stand_by = stand_by
        self.floor = 0
        """The lowest generation this agent may join."""
        self.joining: Arrival | None = None
        """Our place in the round this agent waits in for a seal (a cancelled wait leaves
        it set: the leaver ends the round, or leaves it as a member)."""
        self._arrival: Arrival | None = None
        """Our place in the round being joined, from the ``add`` that gave it until the
        join ends: a join the store cut short (an answer lost) resumes there."""
        self.reserved: socket.socket | None = None
        """The port our last node entry offered for the workers' store, still bound."""
        self.carried: Carried | None = None
        """The last sealed round this agent saw, whose members the next round expects
        (:mod:`agentd.rendezvous.accounting`)."""
        self.sat_out = False  # a round was sealed without us: see kept_workers.py
        self.unsure: tuple[int, int, str] | None = None
        """A round the store forgot as we waited for its seal, before any member told the
        new store it was sealed: its generation, our place, and the server instance."""
        self._unsure_until = 0.0
        """Until when (loop time) the record of :attr:`unsure` may still come."""

    @property
    def settings(self) -> RoundSettings:
        return self._settings

    async def joined(self) -> int:
        """How many nodes joined the round to join now."""
        count = await self._store.get(self._keys.round(await self.generation(), "join"))
        return int(count or b"0")

    async def generation(self) -> int:
        """The generation to join now (raises if the run is closed). A store without one is
        at round 0 (a new run's first round is joined without writing it: one request less
        per node); a store behind what this agent has seen is moved forward to our floor."""
        store = self._store
        raw, closed = await store.multi_get([self._keys.gen, self._keys.closed])
        if closed is not None:
            raise closed_error(self._run_id, closed, newcomer=self.carried is None)
        while int(raw or b"0") < self.floor:
            behind = int(raw or b"0")
            if self.carried is not None and self._membership is not None:
                await forgotten.remember(store, self._keys, self.carried, self._membership.ttl)
            moved, raw = await store.compare_set(self._keys.gen, raw, str(self.floor).encode())
            if moved:  # its round, if anyone waits in it, is over
                ended, _ = await store.compare_set(self._keys.round(behind, "sealed"), None, ENDED)
                said = (
                    "Rendezvous %s: the store is new (it restarted or failed over): its "
                    "generation %d is behind the %d this agent has seen; moved it on to %d"
                )
                # A round this store sealed is no news: it is the round this agent was in
                # (a first round is joined without writing the generation), now over.
                level = logging.INFO if ended else logging.DEBUG
                log.log(level, said, self._run_id, behind, self.floor, self.floor)
        generation = int(raw or b"0")
        self.floor = max(self.floor, generation)
        return generation

    async def join(self) -> Round | None:
        """Join the current round and wait for it to be sealed; None: try the next round.
        After a store error, the next call goes on in the round joined, if it still can."""
        if self._arrival is None or not await self._resumable(self._arrival):
            self._arrival = None
            if not await self._arrive():
                return None
        assert self._arrival is not None
        generation, rank, mine, start, incarnation, instance = self.joining = self._arrival
        try:
            joined = await self._until_sealed(generation, rank, mine, start, incarnation, instance)
        except BaseException as exc:
            if not isinstance(exc, StoreUnavailable):
                self._arrival = None
            raise
        self._arrival = self.joining = None
        return joined

    async def sealed_with_us(self) -> Round | None:
        """The round a cancelled join waited in, where a seal we never read names us among
        its members: a stop signal came just as it was sealed (the others started its
        workers). The leaver then leaves it as a member, so the others re-form at once;
        a store host that ended it as a forming round instead handed nothing over, and
        the others waited the fence of the round its store took with it
        (``tests/sim/test_failover.py``: 20 s)."""
        if self.joining is None:
            return None
        generation, rank, mine = self.joining[:3]
        try:
            summary = await self._sealed_with(generation, rank)
        except RendezvousStateError:  # leaving anyway: the join said what is wrong
            return None
        if summary is None or not await self._holds(generation, rank, mine):
            return None
        self.carried = Carried(generation, summary.size, True, instance_of(self._store))
        return Round(generation, rank, summary, 0, mine)

    async def _resumable(self, arrival: Arrival) -> bool:
        """Whether the store still holds our entry in the round a store error cut our join
        short in: joining anew would arrive a second time, and a round sealed with the
        first arrival would wait for workers never started (seed 28208 of ``bench/
        simulate.py --failover``: the answer to a count was lost in a partition)."""
        if not await self._placed_here(arrival):
            return False
        generation, rank = arrival.generation, arrival.rank
        log.info("Rendezvous %s: still node %d of round %d", self._run_id, rank, generation)
        self._arrival = arrival._replace(instance=instance_of(self._store))
        return True

    async def _placed_here(self, arrival: Arrival, held: bytes | None = None) -> bool:
        """Whether our entry is in the store that gave its place (``held``: what the entry's
        key was read to hold, else it is read). One written after the store was replaced
        (a failover between the ``add`` and the entry) is removed: that store gave the
        place to nobody, or to another node, and a round sealed with it would wait for
        workers never started (seed 27665 of ``--failover``). The round is ended with
        it: a store handed over state and all gave the place, and its seal waited for it
        (the entry timeout, 15 s)."""
        key = self._keys.round(arrival.generation, f"node/{arrival.rank}")
        if held is None:
            held = await self._store.get(key)
        if held != arrival.entry:
            return False
        if incarnation_of(self._store) == arrival.incarnation:
            return True
        await self._store.delete(key)
        await self.advance(arrival.generation, "a place was vacated as the store changed")
        return False

    async def _arrive(self) -> bool:
        """Take a place in the current round and write our entry there (:attr:`_arrival`);
        False: there is none (the round is full, or the place was taken)."""
        store, settings, keys = self._store, self._settings, self._keys
        # a store that restarted has forgotten our heartbeat; a watch from this revision
        # answers ``compacted`` if the store is replaced before we are in the round
        assert self._membership is not None, "joining needs a membership"
        incarnation = incarnation_of(store)  # every step of an arrival in one store
        start = await self._membership.announce()
        stand_by = None if "candidate" in self._node else self._stand_by
        if stand_by is not None and (where := await stand_by()):  # the store has answered
            self._node["candidate"] = where
        generation = await self.generation()
        if self.unsure is not None and self.unsure[0] < generation:  # moved past it: by
            await self._carry_if_forgotten_with_us(*self.unsure)  # one who told the store
        if self.carried is not None and self.carried.generation < generation:
            self.sat_out |= await self.missed_rounds(generation)  # see kept_workers.py
            await self.mark_out()
        if incarnation_of(store) != incarnation:  # our heartbeat, or the generation, was
            return False  # the old store's: arrive in the new one, where nothing was written
        rank = await store.add(keys.round(generation, "join"), 1) - 1
        if rank >= settings.max_nodes:
            carried = self.carried
            if carried is not None and carried.member and carried.generation < generation:
                # back, if without a place (its workers are stopped): a store that forgot
                # our round need not fence it for us (seed 22498 of --failover: 16.5 s)
                await accounting.count_back(store, keys, generation, carried, self.node_id)
            # named, so the next round's first member back can see our lease lapse, and
            # the store's host, once the run is closed, waits for us to read it
            spare = keys.round(generation, f"spare/{rank}")
            await store.set(spare, self.node_id.encode())
            log.info(
                "Rendezvous %s: round %d is full; waiting for the next%s",
                self._run_id,
                generation,
                SHARED_RUN_HINT if self._run_id == SHARED_RUN_ID else "",
            )
            self.carried = Carried(generation, settings.max_nodes, False, instance_of(store))
            self.sat_out = True
            await self.wait_for_generation_after(generation, full=settings.max_nodes)
            return False
        node = {**self._node, "port": self._node["port"] or self._reserve_port()}
        mine = json.dumps(node).encode()
        arrival = self._arrival = Arrival(generation, rank, mine, start, incarnation)
        entry, sealed_key = keys.round(generation, f"node/{rank}"), keys.round(generation, "sealed")
        placed, held = await store.compare_set(entry, None, mine, absent=[sealed_key])
        if not placed and held is None:  # sealed (or ended) before our entry: too late for it
            self._arrival = None
            await self._arrived_late(generation, await store.get(sealed_key))
            return False
        if held == mine and not await self._placed_here(arrival, held):
            self._arrival = None
            said = "Rendezvous %s: the store changed during the join; joining again"
            log.info(said, self._run_id)
            return False
        if not placed and held != mine:  # our place was given by another store (a failover)
            self._arrival = None
            log.warning(
                "Rendezvous %s: place %d of round %d is another node's (the store "
                "changed during the join); joining again",
                self._run_id,
                rank,
                generation,
            )
            return False
        self._arrival = arrival._replace(instance=instance_of(store))
        return True

    async def mark_out(self) -> None:
        """Our workers of our last round are stopped (we join a later round, or step out
        for a while): a round sealed without us need not wait for our lease's end."""
        carried = self.carried
        if carried is not None and carried.member:
            await self._store.set(self._keys.round(carried.generation, f"out/{self.node_id}"), b"1")
            await self.carry_finished(carried)

    async def _end_if_abandoned(self, generation: int, size: int, settle: bool) -> None:
        """End a full round whose members are gone, or one sealed with fewer than ``size``
        (late arrivals took the rest), so a late arrival never waits on it. With ``settle``
        (a check after the first), seal a full round nobody has sealed, as its last arrival
        would have: each arrival that filled it joined again elsewhere (the store failed
        over during its join) and left its place empty, and the spares beside it waited
        for ever (seed 1611 of ``bench/simulate.py --failover``); the seal ends a round
        with a place still empty after the entry timeout."""
        sealed_key = self._keys.round(generation, "sealed")
        kinds = ("node", "done")  # a member whose workers succeeded left no place to take (S7)
        keys = [self._keys.round(generation, f"{k}/{i}") for k in kinds for i in range(size)]
        sealed, *values = await self._store.multi_get([sealed_key, *keys])
        entries, done = values[:size], values[size:]
        nodes = [json.loads(v) for v, d in zip(entries, done, strict=True) if v and not d]
        beats = await self._store.multi_get([self._keys.heartbeat(str(n["node"])) for n in nodes])
        if any(beat is None for beat in beats):
            await self.advance(generation, "a member of the full round is gone")
        elif sealed == ENDED:
            await self._move_past_ended(generation)
        elif sealed is not None and decode(sealed).size < size:
            # late arrivals took the places the seal left (one may be gone since): there
            # is room, so we end the round to be admitted, as a late arrival does. Counted
            # full, a new node waited for ever beside a round of four of five (seed 8933
            # of ``bench/simulate.py --failover --kinds ...,restart``)
            await self.advance(generation, f"node {self.node_id} wants to join")
        elif settle and sealed is None:
            await self._seal(generation, size)

    def _reserve_port(self) -> int:
        """A free port on our address for the workers' store, should we be group rank 0;
        it is held (:attr:`reserved`) until the round tells who serves it."""
        addr = str(self._node["addr"])
        self.release()
        try:
            self.reserved = reserve_port(addr)
        except OSError as exc:
            raise StartError(
                f"--local-addr: {addr!r} is not an address of this host ({exc.strerror})"
            ) from None
        return int(self.reserved.getsockname()[1])

    def release(self) -> None:
        """Let go of a port held for the workers' store."""
        if self.reserved is not None:
            self.reserved.close()
            self.reserved = None

    async def advance(self, generation: int, reason: str) -> None:
        """End round ``generation`` (if it is still the current one) for every agent, and
        mark it ended for any agent still waiting for it to be sealed."""
        store = self._store
        after = str(generation + 1).encode()
        moved, current = await store.compare_set(self._keys.gen, str(generation).encode(), after)
        if not moved and current is None and generation == 0:  # round 0 has no key yet
            await self._remember_if_new()
            moved, current = await store.compare_set(self._keys.gen, None, after)
        if moved:
            log.info("Rendezvous %s: ended round %d: %s", self._run_id, generation, reason)
            await store.compare_set(self._keys.round(generation, "sealed"), None, ENDED)
        else:
            said = "Rendezvous %s: round %d had already ended (now %s)"
            log.debug(said, self._run_id, generation, current)

    async def _remember_if_new(self) -> None:
        """Before round 0 is ended in a store without a generation: if this agent saw round
        0 sealed and the store holds no trace of it, the store is new (it failed over, or
        restarted) and must learn what it forgot first, as :meth:`generation` tells it,
        else the round this end starts could seal beside live workers of round 0 (seed 155
        of ``bench/simulate.py --failover``)."""
        carried = self.carried
        if carried is None or carried.generation != 0 or self._membership is None:
            return
        if await self._store.get(self._keys.round(0, "sealed")) is None:
            await forgotten.remember(self._store, self._keys, carried, self._membership.ttl)

    async def wait_for_generation_after(self, generation: int, full: int | None = None) -> None:
        """Return once the current generation is not ``generation`` (raise if closed).
        ``full``: we wait as a spare beside that round, full with ``full`` members, and
        end it once one of them is gone (every :data:`SPARE_CHECK` seconds): when every
        member died at once, nobody else is left to end it (seed 1397 of the simulation:
        two spares waited for ever beside a round whose hosts were both lost)."""
        store = self._store
        checked = False
        while True:
            revision = await store.revision()
            if await self.generation() != generation:
                return
            if full is not None:
                await self._end_if_abandoned(generation, full, settle=checked)
                checked = True
            await store.watch(self._keys.ctl, revision, POLL if full is None else SPARE_CHECK)
            # loop: re-read, so a compacted or restarted store cannot hide the change
