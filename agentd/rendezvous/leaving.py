"""How an agent leaves a rendezvous: it ends its round for the others (a failure, a
restart, a node that leaves), closes the rendezvous with the job's outcome, and at
shutdown counts itself gone, deletes its heartbeat and, when it serves the store, hands it
over to the next candidate while the job goes on (the others fail over once, as it
leaves), or keeps it up until the round's other members are gone once the job is over
(and, leaving from its exit barrier, first until the others have finished the job).
Should it die instead, its will tells its guardian how to release it
(:mod:`agentd.rendezvous.release`). A mixin of
:class:`~agentd.rendezvous.dynamic.DynamicRendezvous`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.rendezvous.rounds import POLL
from agentd.store.api import StoreError, StoreLeft, StoreUnavailable

if TYPE_CHECKING:
    from agentd.rendezvous.conf import RendezvousSettings
    from agentd.rendezvous.host_memory import HostMemory
    from agentd.rendezvous.keys import RunKeys
    from agentd.rendezvous.membership import Membership
    from agentd.rendezvous.round import Round
    from agentd.rendezvous.rounds import Rounds
    from agentd.store.api import Store
    from agentd.store.connect import OpenedStore

log = logging.getLogger(__name__)

_LEAVE_TIMEOUT = 2.0
"""Deleting our heartbeat is a courtesy (it expires anyway): never wait long for it."""


class Leaving:
    """Ending rounds, closing and leaving, for a rendezvous that holds the store, keys,
    round and lease (state lives on the rendezvous)."""

    settings: RendezvousSettings
    node_id: str
    _run_id: str
    _keys: RunKeys
    _round: Round | None
    _rounds: Rounds | None
    _store: Store | None
    _opened: OpenedStore | None
    _membership: Membership | None
    _memory: HostMemory | None
    _ended_generation: int | None
    _done_generation: int | None
    _unended: int | None
    _closed: bool
    _close: bytes | None
    """The close this agent wrote (:meth:`set_closed`), to write again where it was lost."""
    _leaving: bool
    _shutting: asyncio.Task[None] | None
    _will: dict[str, Any] | None
    _will_listeners: list[Callable[[dict[str, Any] | None], None]]

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        def _rounds_or_fail(self) -> Rounds: ...

        async def _serve_the_others(self) -> bool: ...

        async def _pass_the_store_on(self, current: Round) -> bool: ...

    def _no_store(self) -> Exception:
        """What asking for the store raises without one: before it was opened, a caller's
        bug; once this agent left (its store closed), a :class:`StoreError`, which a
        service still at work (a drain waiting for checkpoints as the job ends) takes as
        the store lost. It was the bug's RuntimeError, whose traceback ended the agent's
        exit (``bench/bench_chaos.py --inprocess --stragglers`` seed 3, 2026-12-04)."""
        if self._leaving:
            return StoreError(f"rendezvous {self._run_id}: this agent left; its store is closed")
        return RuntimeError("the rendezvous has not opened its store yet")

    def on_will(self, listener: Callable[[dict[str, Any] | None], None]) -> None:
        """Tell ``listener`` how another process may release our membership should this
        agent die (see :mod:`agentd.rendezvous.release`), whenever that changes."""
        self._will_listeners.append(listener)

    def _tell_will(self, member: bool) -> None:
        """Tell the listeners our will, when it changed: a member's, or none (``member``
        False, and for good once this agent leaves)."""
        if not self._will_listeners:
            return
        from agentd.rendezvous.release import will

        current = self._round if member and not self._leaving else None
        doc = will(self._run_id, self.node_id, self._opened, self._rounds, current)
        if doc != self._will:
            before = self._will["store"].get("endpoints") if self._will else None
            self._will = doc
            serves = self._opened is not None and self._opened.serves
            if doc is not None and serves and doc["store"]["endpoints"] != before:
                log.info(
                    "Rendezvous %s: this agent serves the store; should it die, its "
                    "guardian releases it through the store candidates %s",
                    self._run_id,
                    ", ".join(doc["store"]["endpoints"]),
                )
            for listener in self._will_listeners:
                listener(doc)

    async def leaving_soon(self) -> None:
        """As :class:`~agentd.rendezvous.api.LeasedMembership` says: its workers take a
        while to stop, and a store's host that hands the store over meanwhile (all stopped
        at once) would otherwise pass it to this agent, which passes it on as it leaves."""
        if self._opened is not None and self._opened.stop_standing_by is not None:
            await self._opened.stop_standing_by()

    async def workers_stopped(self) -> None:
        """Our workers of the current round are stopped, and we step out of the job for a
        while (a node check failed): the others need not fence us (see
        :meth:`~agentd.rendezvous.rounds.Rounds.mark_out`)."""
        if self._rounds is not None:
            await self._rounds.mark_out()

    async def end_round(self, reason: str) -> None:
        """End our round for every peer. A store out of reach is not waited for longer
        than the heartbeat TTL (the peers lose their leases meanwhile anyway): the round
        is ended as soon as the store answers, when this agent rejoins."""
        current = self._round
        if current is None or self._ended_generation == current.generation:
            return
        self._ended_generation = current.generation
        try:
            async with asyncio.timeout(self.settings.heartbeat_ttl):
                await self._rounds_or_fail().advance(current.generation, reason)
        except StoreLeft:
            raise  # nobody is left to end it for
        except (StoreUnavailable, TimeoutError) as exc:
            self._unended = current.generation
            why = str(exc) or "no answer in time"
            raise StoreUnavailable(
                f"the store cannot be reached ({why}); the round will be ended when it answers"
            ) from None

    async def _end_forming_round(self) -> None:
        """Leaving while waiting in a round not yet sealed (a stop signal during the
        rendezvous): end it, so the peers waiting in it re-form without us and no round
        is sealed with a member already gone."""
        rounds = self._rounds
        forming = rounds.joining if rounds is not None and self._round is None else None
        if rounds is not None and forming is not None:
            rounds.joining = None
            reason = f"node {self.node_id} left while it was forming"
            await rounds.advance(forming.generation, reason)

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        if self._store is None or self._closed:
            return
        self._closed = True
        doc = {
            "outcome": "succeeded" if succeeded else "failed",
            "node": self.node_id,
            "reason": reason,
        }
        self._close = json.dumps(doc).encode()
        try:  # the outcome is ours already: a store out of reach is not waited for long
            async with asyncio.timeout(self.settings.heartbeat_ttl):
                await self._store.compare_set(self._keys.closed, None, self._close)
        except TimeoutError:
            raise StoreUnavailable("the store cannot be reached to close the rendezvous") from None
        self._no_lease_left()

    def _no_lease_left(self) -> None:
        """No worker of the run can hold a lease of our store now (the run closed, or every
        other member left): a restart of our host need not fence our last round."""
        if self._memory is not None:
            self._memory.forget()

    async def shutdown(self) -> None:
        """Leave the job: hand the store over if we serve it, end our round so the others
        re-form at once, delete our heartbeat, close the store. A call while another runs
        (a second stop signal) waits for that one: two leaves at once raced, and the first
        to end closed the store under the other, whose round was then fenced for 16.5 s
        instead of ended (seed 8218 of ``bench/simulate.py --failover``)."""
        if self._shutting is None or self._shutting.done():
            self._shutting = asyncio.ensure_future(self._leave())
        await self._shutting

    async def _leave(self) -> None:
        self._leaving = True
        self._tell_will(member=False)  # this agent releases its own membership now
        if self._rounds is not None:
            self._rounds.release()
        reached = self._membership is not None and self._membership.answered
        if self._membership is not None:
            await self._membership.stop()
        if self._store is None or self._opened is None:
            return
        if self._opened.leaving is not None:
            await self._opened.leaving()
        handed = False
        try:
            if not reached:  # the store never answered us: nothing of ours is there
                return
            if not self._closed and await self._serve_the_others():
                self._closed = True  # the others finished and closed the run meanwhile
            if not self._closed:  # the others re-form without us, at once
                if self._round is None and self._rounds is not None:
                    async with asyncio.timeout(_LEAVE_TIMEOUT):
                        self._round = await self._rounds.sealed_with_us()
                current, marked = self._round, {}
                if self._opened.hand_over is not None and current is not None:
                    if await self._pass_the_store_on(current):  # with its state: marks too
                        handed = True
                    elif self._opened.serves and self._rounds is not None:
                        marked = await self._gone_marks()  # the others who left
                    if not handed:
                        handed = await self._opened.hand_over(current.size)  # empty
                    if handed and self._memory is not None:
                        self._memory.handed_over(asyncio.get_running_loop().time())
                # A member whose workers succeeded (in its exit barrier) leaves no work
                # undone: the round goes on for the others' workers.
                done = current is not None and current.generation == self._done_generation
                async with asyncio.timeout(self.settings.close_timeout):
                    if self._round is not None and self._rounds is not None:
                        marks = marked if handed else None
                        await self._rounds.settle(self.node_id, marks, round_goes_on=done)
                    if not done:
                        await self.end_round(f"node {self.node_id} left")
                        await self._end_forming_round()
            async with asyncio.timeout(_LEAVE_TIMEOUT):
                await self._store.delete(self._keys.heartbeat(self.node_id))
            if self._opened.serves and not handed and await self._wait_for_peers_to_leave():
                self._no_lease_left()
        except StoreLeft as exc:
            log.info("Rendezvous %s: the others have left too (%s)", self._run_id, exc)
            self._no_lease_left()
        except (StoreError, TimeoutError) as exc:
            log.warning(
                "Rendezvous %s: could not leave cleanly: %s",
                self._run_id,
                str(exc) or "no answer in time",
            )
        finally:
            await self._opened.close()
            self._store = self._opened = self._membership = self._rounds = None

    async def _gone_marks(self) -> dict[str, bytes]:
        """The gone marks our store holds for our round's other members, to carry to the
        next server; none where they cannot be read at once (a courtesy, as the leave)."""
        rounds = self._rounds
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(_LEAVE_TIMEOUT):
                return await rounds.gone_marks() if rounds is not None else {}
        return {}

    async def _member_ids(self) -> list[str]:
        """The node ids of the current round's members (none between rounds)."""
        current, rounds = self._round, self._rounds
        return await rounds.member_ids(current) if current and rounds else []

    async def _spares_to_tell(self) -> list[str]:
        """The spares waiting beside our round, once the run is closed: each reads the
        close in our store, and leaves. A store that went away at once was gone before a
        spare slower than its host (frozen, or on a loaded machine) had read it: the spare
        failed over to an empty store, took it for a new job, waited out its join timeout
        and exited 3 after a job that succeeded (``bench/bench_chaos.py`` seed 131). A
        spare that serves the store (it has no round) tells the other spares of the last
        round sealed: it left at once, and with ``MIN`` nodes the next spare to take the
        store over ran the job again (S9, seed 40 of ``bench/simulate.py --closing``)."""
        current, rounds = self._round, self._rounds
        if rounds is None:
            return []
        if current is not None:
            spares = await rounds.spare_ids(current) if self._closed else []
        elif await self.store.get(self._keys.closed) is not None:  # a spare serving the store
            spares = [node for node in await rounds.last_spare_ids() if node != self.node_id]
        else:
            spares = []
        if spares:
            log.info(
                "Rendezvous %s: the run is closed; this node keeps the store up until the "
                "%d spare(s) waiting beside it have read it (at most %gs, close_timeout)",
                self._run_id,
                len(spares),
                self.settings.close_timeout,
            )
        return spares

    async def _wait_for_peers_to_leave(self) -> bool:
        """Keep the store we serve up until the round's other members are gone (their
        heartbeats deleted or expired), and, once the run is closed, its spares
        (:meth:`_spares_to_tell`) and those still failing over to it
        (:meth:`_outlast_a_failover`), at most ``close_timeout`` seconds; False if some
        were not."""
        store = self.store
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.close_timeout):
                nodes = await self._member_ids() + await self._spares_to_tell()
                keys = [self._keys.heartbeat(node) for node in nodes]
                while True:
                    revision = await store.revision()
                    *beats, closed = await store.multi_get([*keys, self._keys.closed])
                    if closed is None and self._close is not None:
                        await self._close_again()
                    if all(beat is None for beat in beats):
                        break
                    await store.watch(self._keys.heartbeats, revision, POLL)
                if closed is not None or self._close is not None:  # (written again, then)
                    await self._outlast_a_failover()
                return True
        return False

    async def _close_again(self) -> None:
        """The store we reach lacks the close we wrote: ours stepped down since (we closed
        the run cut off from the others, who failed over meanwhile), or it restarted.
        Write it again there, or the spares waiting in it never learn that the job is
        over, and one of them, with ``MIN`` nodes, runs it again (S9: seed 2162 of
        ``bench/simulate.py --closing``)."""
        assert self._close is not None
        log.info(
            "Rendezvous %s: the store now serving lacks the close; this node writes it again",
            self._run_id,
        )
        await self.store.compare_set(self._keys.closed, None, self._close)

    async def _outlast_a_failover(self) -> None:
        """The run being closed on a store that took over from another (or restarted)
        lately (its fence of the round it forgot still stands, or it does not hold our
        round), keep it up one heartbeat TTL, a spare serving it too: the others may
        still be failing over to it, and read the close only while it is up. Gone at
        once, it took the close along: a spare failed over to the next candidate, empty,
        took it for a new job and, with ``MIN`` nodes, ran the job again after it had
        succeeded (S9,
        ``tests/sim/test_protocol.py::test_a_run_closed_after_a_failover_reaches_every_spare``)."""
        current = self._round
        keys = [self._keys.forgotten]
        if current is not None:
            keys.append(self._keys.round(current.generation, "sealed"))
        fence, *sealed = await self.store.multi_get(keys)
        if fence is None and (current is None or sealed[0] is not None):
            return  # (the fence: it took over lately)
        log.info(
            "Rendezvous %s: the run is closed on a store that took over lately; this node "
            "keeps it up %gs (the heartbeat TTL) for the others still on their way to it",
            self._run_id,
            self.settings.heartbeat_ttl,
        )
        await asyncio.sleep(self.settings.heartbeat_ttl)
