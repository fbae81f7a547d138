"""The exit barrier: an agent whose workers succeeded waits for every member's workers to
be done before it leaves, so no agent leaves while its peers may still need it (the
store's host, rank 0's master). A mixin of :class:`~agentd.rendezvous.dynamic.DynamicRendezvous`.

The wait ends when every member wrote ``round/<g>/done/<i>``; when our lease is lost (the
store is out of reach: nobody can be waited for without it); or when the rendezvous is
closed, which a member that failed for good does: its done key would never come, and its
peers waited out the agent's whole barrier timeout (300 s by default) before.

A store's host hands the store, state and all, to a member still at work as it enters
its barrier (:meth:`ExitBarrier._hand_the_store_down`), so its loss there costs the
others nothing; where it could not and is stopped there (SIGTERM, a second drain
request), it keeps the store up for them until they close the run
(:meth:`ExitBarrier._serve_the_others`), then passes it on with its state if it can.
A store that fails over and forgets the round under the barrier is told at once: this
node counts itself finished there and waits on (:meth:`ExitBarrier._closed_elsewhere`).

A round ended meanwhile (a member's workers failed, or it was lost) does not end the wait:
the others may finish the job in the next round, and close the run once they have. The
agent says so once; it used to wait silently. But where every member is done or left for
good (a leave, or its guardian's release after a SIGKILL) and nobody arrived at the next
round, no node will write the missing ``done`` keys nor close the run: the wait ends, with
a WARNING, instead of at the barrier timeout (300 s by default), after which the run was
closed as succeeded all the same; so it does where the others re-formed without this
node after its round ended, then all left that round too
(:mod:`~agentd.rendezvous.barrier_state`). A member lost with no mark (its host lost, its
agent frozen or cut off past its lease) is counted gone by the members before it, which
look at their successors' leases meanwhile, in a store that forgot the round too
(:mod:`~agentd.rendezvous.barrier_leases`).
The wait for the ``done`` keys is made in pieces of :data:`CHECK` seconds with the round's
state read between them, so a node in the barrier holds no more long polls at the store
than it did (a job's size is bounded by the store's connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError
from agentd.rendezvous.barrier_leases import SuccessorLeases
from agentd.rendezvous.barrier_state import Arrivals, nobody_left_because, round_state
from agentd.store.api import StoreError, StoreTimeout, StoreUnavailable
from agentd.support.aio import first_done

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from agentd.rendezvous.conf import RendezvousSettings
    from agentd.rendezvous.host_memory import HostMemory
    from agentd.rendezvous.keys import RunKeys
    from agentd.rendezvous.membership import Membership
    from agentd.rendezvous.round import Round
    from agentd.rendezvous.round_watch import RoundWatch
    from agentd.rendezvous.rounds import Rounds
    from agentd.store.api import Store
    from agentd.store.connect import OpenedStore

log = logging.getLogger(__name__)

FOREVER = 7 * 86400.0
"""A store wait with no end of its own (the agent's barrier timeout ends it)."""
CHECK = 5.0
"""Seconds between two reads of the round's state while the barrier waits (one request
per node): a round ended is said, and one nobody can finish left, within this long."""


HAND_DOWN_READS = 64
"""The most members at work (and done) whose candidates a store's host reads."""
LEAVE_HAND_DOWN = 5.0
"""Seconds a leaving store's host tries to hand the store down before it hands it over empty."""
SERVING_CHECK = 1.0
"""Seconds between two reads of the generation while a leaving store's host waits for the
others to close the run (it waits ``close_timeout`` at most, not the barrier's 300 s)."""


class ExitBarrier:
    """``exit_barrier()`` of a rendezvous that holds the store, keys, round and lease."""

    settings: RendezvousSettings
    _run_id: str
    _keys: RunKeys
    node_id: str
    _round: Round | None
    _rounds: Rounds | None
    _membership: Membership | None
    _done_generation: int | None = None
    """The round whose ``done`` key this node wrote (its workers succeeded in it): its
    leave then ends no round (:mod:`agentd.rendezvous.round_watch`)."""
    _opened: OpenedStore | None
    _round_watch: RoundWatch | None = None
    """The watch of the last round this node worked in (its successors' ids)."""
    _memory: HostMemory | None
    _hurry: asyncio.Event | None = None
    """Set by a second stop request: a leaving store's host waits for the others no more."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

    async def exit_barrier(self) -> None:
        """Wait for every member's workers to be done, or for the rendezvous to close; a
        store out of reach for as long as our lease lasts ends the wait
        (:class:`StoreUnavailable`): nobody can be waited for without it. A lease already
        gone (the agent was frozen while its workers finished) leaves the barrier a
        heartbeat TTL to get through: the store may answer, and the peers then need not
        wait for us."""
        current = self._round
        membership = self._membership
        if current is None or membership is None:
            return
        watch = self._round_watch
        known = watch.ranks if watch and watch.current.generation == current.generation else None
        leases = SuccessorLeases(
            self.store, self._keys, current.generation, current.size, current.rank, known
        )
        if membership.expired():
            try:
                async with asyncio.timeout(self.settings.heartbeat_ttl):
                    await self._barrier(current, leases)
            except TimeoutError:
                raise StoreUnavailable(
                    "our membership had lapsed and the barrier did not complete within the "
                    "heartbeat TTL"
                ) from None
            return
        barrier, lost, closed = await first_done(
            self._barrier(current, leases), membership.lost(), self._closed_elsewhere(current)
        )
        while _forgotten(closed) or (
            barrier.cancelled() and closed.cancelled() and await self._store_forgot(current)
        ):
            log.warning(
                "Exit barrier: the store failed over and forgot round %d; this node's workers "
                "are done, which it counts there, and it waits, up to the barrier timeout, "
                "for the others to finish and close the run",
                current.generation,
            )  # (leaving now closed the run as succeeded while the others worked on)
            leases.store_forgot_round(
                self.settings.heartbeat_ttl, asyncio.get_running_loop().time()
            )
            barrier, closed = await first_done(
                self._barrier(current, leases), self._closed_elsewhere(current)
            )
        if closed.done() and not closed.cancelled() and (result := closed.result()) is not None:
            why, failed = result
            level = logging.WARNING if failed else logging.DEBUG  # succeeded: all were done
            log.log(level, "Exit barrier: %s; not waiting for the other nodes", why)
            return
        if barrier.cancelled():
            raise StoreUnavailable(f"the store cannot be reached: {lost.result()}")
        barrier.result()

    async def _store_forgot(self, current: Round) -> bool:
        """The store answers within a second, and no longer holds our entry of round
        ``current``: it failed over (or restarted) empty."""
        key = self._keys.round(current.generation, f"node/{current.rank}")
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(1.0):
                return await self.store.get(key) != current.mine
        return False

    async def _barrier(self, current: Round, leases: SuccessorLeases) -> None:
        """Wait as :meth:`exit_barrier` says, looking at ``leases`` where some member is
        unaccounted for."""
        store = self.store
        gen = current.generation
        await store.set(self._keys.round(gen, f"done/{current.rank}"), b"1")
        self._done_generation = gen
        if self._rounds is not None:  # a restart of the others need not wait for us
            await self._rounds.count_finished(self.node_id, gen)
        if current.size > 1:
            log.info(
                "Rendezvous %s: this node's workers are done (round %d); waiting for those of "
                "the other %d node(s) (exit barrier)",
                self._run_id,
                gen,
                current.size - 1,
            )
        done = [self._keys.round(gen, f"done/{i}") for i in range(current.size)]
        await leases.learn()  # while the store holds the round: it may forget it later
        forgotten = leases.round_forgotten
        loop = asyncio.get_running_loop()
        arrivals = Arrivals(store, self._keys, self.settings.heartbeat_ttl, loop.time)
        said_ended, pause = False, CHECK
        handed = await self._hand_the_store_down(gen, current.size)
        while True:
            try:
                await store.wait(done, pause)
                return
            except StoreTimeout:
                pass
            handed = handed or await self._hand_the_store_down(gen, current.size)
            state = await round_state(store, self._keys, gen, current.size, arrivals, forgotten)
            pause = CHECK
            if state.unaccounted:
                marked, fencing = await leases.look(loop.time())
                if marked:
                    state = await round_state(
                        store, self._keys, gen, current.size, arrivals, forgotten
                    )
                if fencing:  # look again once its fence let it be counted
                    pause = min(CHECK, leases.fence)
            lost = leases.unseen_are_lost(loop.time())
            if lost and not state.nobody_left:
                state = await round_state(
                    store, self._keys, gen, current.size, arrivals, forgotten, lost
                )
            if state.nobody_left:
                log.warning(
                    "Exit barrier: %s; no node is at work to finish the job: leaving now, not "
                    "at the barrier timeout",
                    nobody_left_because(state, gen, lost),
                )
                return
            if state.ended and not said_ended:
                said_ended = True
                log.warning(
                    "Exit barrier: round %d ended while this node waited (its workers "
                    "succeeded; a peer's failed, or a peer was lost); waiting, up to the "
                    "barrier timeout, for the others to finish in the next round and close "
                    "the run",
                    gen,
                )

    async def _hand_the_store_down(self, gen: int, size: int) -> bool:
        """Where this node serves the store, hand it, state and all, to the candidate of a
        member of round ``gen`` still at work (:mod:`agentd.store.succession`), so that
        losing this node in its barrier (a SIGKILL, its host lost, a freeze) costs the
        others' round nothing: the store went with it, and their workers were stopped
        mid-work. Whether there is nothing more to try (handed, or nothing to hand); none
        at work stands by yet: tried again at the next check."""
        hand_down = self._store_to_hand_down(size)
        if hand_down is None:
            return True
        try:
            at_work, _, working = await self._candidates(gen, size)
            to = await hand_down(at_work) if at_work else ""
        except (StoreError, ConfigError, ValueError, AttributeError) as exc:
            log.debug("Exit barrier: the store not handed down: %s", exc)
            return False
        if to:
            self._handed_down()
            log.info(
                "Rendezvous %s: this node's workers are done: it handed the store it served "
                "to %s, the candidate of a node still at work (this node's loss no longer "
                "takes the store's state along)",
                self._run_id,
                to,
            )
        return bool(to) or not working

    async def _pass_the_store_on(self, current: Round) -> bool:
        """This node leaves and serves the store: hand it, state and all, to another
        member's candidate (those at work first), so the store is not new to the others
        (a new one fenced the round it forgot for a lease: 20 s in seed 2381 of
        ``bench/simulate.py --failover``). Whether it did."""
        hand_down = self._store_to_hand_down(current.size)
        if hand_down is None:
            return False
        with contextlib.suppress(StoreError, ConfigError, ValueError, AttributeError):
            async with asyncio.timeout(LEAVE_HAND_DOWN):
                at_work, done, _ = await self._candidates(current.generation, current.size)
                if await hand_down([*at_work, *done]):
                    self._handed_down()
                    return True
        return False

    def _store_to_hand_down(self, size: int) -> Callable[[Sequence[str]], Awaitable[str]] | None:
        """:attr:`OpenedStore.hand_down`, where this node serves a store it can hand down
        and its round of ``size`` has another member (None: nothing to hand)."""
        opened = self._opened
        if opened is None or opened.hand_down is None or not opened.serves or size < 2:
            return None
        return opened.hand_down

    async def _candidates(self, gen: int, size: int) -> tuple[list[str], list[str], int]:
        """Where the members of round ``gen`` stand by for the store: those still at work,
        and those whose workers are done (:data:`HAND_DOWN_READS` of each at most); and
        how many are at work."""
        keys, store = self._keys, self.store
        marks = await store.multi_get([keys.round(gen, f"done/{i}") for i in range(size)])
        at_work = [i for i, mark in enumerate(marks) if mark is None][:HAND_DOWN_READS]
        done = [i for i, mark in enumerate(marks) if mark is not None][:HAND_DOWN_READS]
        entries = await store.multi_get([keys.round(gen, f"node/{i}") for i in at_work + done])
        found = [str(json.loads(e).get("candidate") or "") if e else "" for e in entries]
        working = sum(mark is None for mark in marks)
        return (
            [c for c in found[: len(at_work)] if c],
            [c for c in found[len(at_work) :] if c],
            working,
        )

    def _handed_down(self) -> None:
        """A restart of this host need not fence its first round for the leases our store
        granted: they are renewed at the successor (see :meth:`HostMemory.handed_over`)."""
        if self._memory is not None:
            self._memory.handed_over(asyncio.get_running_loop().time())

    async def _closed_elsewhere(self, current: Round) -> tuple[str, bool] | None:
        """Once the rendezvous is closed: by whom and why, and whether as failed (a member
        that failed for good; else one that passed the barrier already). None, at once,
        where the store failed over and forgot round ``current`` (a watch from before a
        move answers ``compacted``): our heartbeat, gone with it, would tell in up to a
        heartbeat interval, and the round after it waits for us meanwhile."""
        store, key = self.store, self._keys.closed
        revision = await store.revision()
        while (raw := await store.get(key)) is None:
            result = await store.watch(key, revision, FOREVER)
            if result.compacted and await self._store_forgot(current):
                return None
            revision = result.revision
        try:
            doc = json.loads(raw)
            why = f"node {doc['node']} closed the rendezvous as {doc['outcome']}: {doc['reason']}"
            return why, doc["outcome"] != "succeeded"
        except (ValueError, KeyError, TypeError):
            return "the rendezvous was closed", True

    def hurry(self) -> None:
        """A second stop request: a store's host that keeps the store up for the others as
        it leaves from its exit barrier (:meth:`_serve_the_others`) leaves at once."""
        self._hurried().set()

    def _hurried(self) -> asyncio.Event:
        if self._hurry is None:
            self._hurry = asyncio.Event()
        return self._hurry

    async def _serve_the_others(self) -> bool:
        """Whether the run was closed while this node, leaving from its exit barrier, kept
        the store it serves up for the others: until the last of them passes its barrier
        and closes the run, for ``close_timeout`` seconds at most, unless the round ends or
        a second stop request comes first (:meth:`hurry`). Nothing to wait for (False)
        where this node did not finish in its round, serves no store, or is alone.

        Handing the store over at once started the next candidate empty: the others'
        round went with the old state, and their workers were stopped in the middle of
        their work (rank 0's final save), where a member that is not the store's host
        leaves the round going on (:mod:`agentd.rendezvous.round_watch`)."""
        current, opened = self._round, self._opened
        if current is None or current.generation != self._done_generation or current.size < 2:
            return False
        if opened is None or not opened.serves:
            return False
        hurry = self._hurried()
        if hurry.is_set():
            return False
        limit = self.settings.close_timeout
        log.info(
            "Rendezvous %s: this node serves the store and its workers are done: it keeps "
            "the store up until the other nodes' workers are done too (at most %gs, "
            "close_timeout; a second stop request leaves at once)",
            self._run_id,
            limit,
        )
        closed, why = False, f"they did not finish within {limit:g}s"
        with contextlib.suppress(TimeoutError, StoreError):
            async with asyncio.timeout(limit):
                ended, _ = await first_done(self._closed_or_ended(current), hurry.wait())
                if ended.cancelled():
                    why = "a second stop request"
                else:
                    closed = ended.result()
                    why = "the run was closed" if closed else f"round {current.generation} ended"
        log.info("Rendezvous %s: this node leaves the store: %s", self._run_id, why)
        return closed

    async def _closed_or_ended(self, current: Round) -> bool:
        """Once the run is closed (True), or round ``current`` ended (False)."""
        store, keys = self.store, self._keys
        while True:
            try:
                await store.wait([keys.closed], SERVING_CHECK)
                return True
            except StoreTimeout:
                now = await store.get(keys.gen) or b""
                if now.isdigit() and int(now) > current.generation:
                    return False


def _forgotten(closed: asyncio.Future[tuple[str, bool] | None]) -> bool:
    """The wait for the run's close ended on a store that forgot our round."""
    return closed.done() and not closed.cancelled() and closed.result() is None
