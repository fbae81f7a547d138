"""DynamicRendezvous: elastic, generation-numbered rounds over any :class:`Store`.

The same code runs on the embedded store and on etcd; the keys are in
:mod:`agentd.rendezvous.keys`. A round is sealed by the arrival that makes it full
(``max_nodes``), or, once ``min_nodes`` are in, by the first agent whose last-call timer
runs out. Everyone else learns of the seal through a watch on that one key, so
completion takes one round trip after the last join, and each agent does a fixed number
of store operations per round. An arrival after the seal waits for the next round; if
the round has room it ends it at once (scale-up). While the group runs,
:meth:`round_over` watches ``ctl/``: a new generation (a failure or a join elsewhere), a
member's heartbeat vanishing (scale-down) or the rendezvous closing.

Invariants under faults:

* **Generations only go forward.** An agent never joins a generation lower than one it
  has seen, nor one it was a member of. A store that forgot the run (restarted, wiped)
  or lags behind is moved forward to that floor, so after a store loss every agent meets
  in one new round, whatever it last saw. Ending a round also seals it as "0" if it was
  never sealed, so agents still waiting in it move on at once.
* **Membership is a lease** (:mod:`agentd.rendezvous.membership`): :meth:`round_over`
  returns before the lease on our heartbeat can end, and :meth:`lease_deadline` tells
  the agent when the workers must be gone. The round is ended for the others as soon as
  the store answers again.
* **A store outage is waited out.** A store that cannot be reached while this agent
  joins is retried until the join timeout, at the first rendezvous too (its host may
  start later).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from agentd.exceptions import ConfigError
from agentd.rendezvous.api import RendezvousInfo, RendezvousTimeoutError
from agentd.rendezvous.closed import closed_error
from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.drains import Drains
from agentd.rendezvous.exclusions import Exclusions
from agentd.rendezvous.exit_barrier import ExitBarrier
from agentd.rendezvous.host_memory import HostMemory, RoundKeeper
from agentd.rendezvous.job_records import JobRecords
from agentd.rendezvous.kept_workers import KeptWorkers
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.leaving import Leaving
from agentd.rendezvous.membership import LeaseListener, Membership
from agentd.rendezvous.no_round import no_round_message
from agentd.rendezvous.roll_call import RollCalls
from agentd.rendezvous.round import Round, RoundSettings
from agentd.rendezvous.round_watch import RETRY_PAUSE, RoundWatch
from agentd.rendezvous.rounds import Rounds
from agentd.rendezvous.timings import NodeTimings
from agentd.store.api import Store, StoreError, StoreUnavailable
from agentd.store.connect import OpenedStore, StoreOpener
from agentd.support.aio import first_done
from agentd.support.ratelog import RateLimitedLog

log = logging.getLogger(__name__)


class DynamicRendezvous(Leaving, RollCalls, ExitBarrier, KeptWorkers):
    """An elastic rendezvous for ``run_id`` over a store opened by ``open_store``.

    ``open_store`` is called on the first rendezvous, in the agent's loop (see
    :mod:`agentd.store.connect`). ``role`` and
    ``local_world_size`` are what this agent contributes to rank assignment; ``addr`` is
    where its workers are reachable, used as MASTER_ADDR when it is group rank 0.
    """

    def __init__(
        self,
        run_id: str,
        open_store: StoreOpener,
        settings: RendezvousSettings,
        *,
        role: str = "default",
        local_world_size: int = 1,
        addr: str = "127.0.0.1",
        master_port: int | None = None,
        backend: str = "agentd",
        keeper: RoundKeeper | None = None,
    ) -> None:
        if not 1 <= settings.min_nodes <= settings.max_nodes:
            raise ConfigError(
                f"nnodes: {settings.min_nodes}:{settings.max_nodes} must have 1 <= MIN <= MAX"
            )
        self._run_id = run_id
        self._open_store = open_store
        self.settings = settings
        self._role = role
        self._local_world_size = local_world_size
        self._addr = addr
        self._master_port = master_port
        self._backend = backend
        self._keeper = keeper
        self._memory: HostMemory | None = None
        self.node_id = f"{socket.gethostname()}_{os.getpid()}_{os.urandom(3).hex()}"
        self._keys = RunKeys(run_id)
        self._beat = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        self.exclusions = Exclusions(lambda: self.store, self._keys, self.node_id)
        self._drains = Drains(lambda: self.store, self._keys, self.node_id, self._member_ids)
        self.timings = NodeTimings(lambda: self.store, self._keys)
        self.job = JobRecords(lambda: self.store, self._keys, self.node_id, addr)
        self._store: Store | None = None
        self._opened: OpenedStore | None = None
        self._membership: Membership | None = None
        self._lease_listeners: list[LeaseListener] = []
        self._will_listeners: list[Callable[[dict[str, Any] | None], None]] = []
        self._will: dict[str, Any] | None = None
        self._leaving = self._closed = False
        self._close: bytes | None = None
        self._shutting: asyncio.Task[None] | None = None
        self._round: Round | None = None
        self._rounds: Rounds | None = None
        self._ended_generation: int | None = None
        self._unended: int | None = None
        """A round we left without being able to end it for the others (store unreachable)."""
        self._joined_once = False
        self._store_problem = ""
        self._observer: Callable[[str, float], None] | None = None
        self._problems = RateLimitedLog(log)
        self._node: dict[str, Any] = {}
        self._kept: list[int] = []

    def peer_loss_timeout(self) -> float:
        return self.settings.heartbeat_ttl

    async def publish_exclusion(self, doc: dict[str, Any] | None) -> None:
        """Tell the other agents why this node stays out (None: that it is back)."""
        await self._open()
        await self.exclusions.publish(doc, self.settings.heartbeat_ttl)

    def observe_store(self, observer: Callable[[str, float], None]) -> None:
        """Tell ``observer`` (operation, seconds) of every store request over the network."""
        self._observer = observer
        if self._store is not None and hasattr(self._store, "observer"):
            self._store.observer = observer

    def on_lease(self, listener: LeaseListener) -> None:
        """Tell ``listener`` when the lease on our membership ends, whenever that moves."""
        self._lease_listeners.append(listener)
        if self._membership is not None:
            self._membership.on_lease(listener)

    def store_status(self) -> dict[str, Any] | None:
        """Where the store is; with candidate lists, which candidate serves, which failed."""
        opened = self._opened
        if opened is None:
            return None
        return opened.describe() if opened.describe else {"where": opened.where}

    def lease_deadline(self) -> float | None:
        """When our lease ends (monotonic): no worker of ours runs after it (None: none)."""
        return self._membership.deadline if self._membership is not None else None

    def membership_lost(self) -> str:
        """Why we are no longer a member of the current round ('' while we are)."""
        if self._membership is None or self._round is None:
            return ""
        return self._membership.expired()

    # -- the handler protocol ---------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self._run_id

    def bind_worker_spec(self, role: str, local_world_size: int) -> None:
        """The agent's role and worker count, for a handler built before its spec."""
        self._role, self._local_world_size = role, local_world_size

    def drains(self) -> Drains:
        return self._drains

    @property
    def use_agent_store(self) -> bool:
        """Group rank 0's agent serves the workers' store (see :meth:`take_master_socket`)."""
        return True

    def take_master_socket(self, port: int) -> socket.socket | None:
        """The socket bound to ``port`` for the workers' store, if this agent offered it in
        the round just completed (the caller owns it then); None otherwise."""
        rounds = self._rounds
        if rounds is None or rounds.reserved is None:
            return None
        sock, rounds.reserved = rounds.reserved, None
        if sock.getsockname()[1] != port:
            sock.close()
            return None
        return sock

    @property
    def store(self) -> Store:
        if self._store is None:
            raise self._no_store()
        return self._store

    async def next_rendezvous(self) -> RendezvousInfo:
        await self._open()
        membership = self._membership
        assert membership is not None
        self._round = None
        membership.member = False
        self._tell_will(member=False)  # from here on it may count itself back in a new round
        try:
            async with asyncio.timeout(self.settings.join_timeout):
                joined = await self._join_until_member()
        except TimeoutError:
            message = await no_round_message(
                self._run_id,
                self.settings,
                self._rounds_or_fail(),
                self._store_problem,
                self.store_status(),
            )
            raise RendezvousTimeoutError(message) from None
        self._round = joined
        self._tell_will(member=True)
        if self._memory is not None:
            self._memory.renewed(membership.deadline)
        self._joined_once = True
        if self._opened is not None and self._opened.after_round is not None:
            own = self._node.get("candidate")
            self._opened.after_round([peer for peer in joined.summary.peers if peer != own])
        rounds = self._rounds_or_fail()
        rounds.floor = max(rounds.floor, joined.generation + 1)
        if joined.rank == 0:
            await self._forget_round(joined.generation - 2)
        else:
            rounds.release()  # group rank 0's agent serves the workers' store, not us
        membership.rejoined()
        membership.member = True
        summary = joined.summary
        self.exclusions.after_round(self._run_id, summary.excluded)
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=joined.rank,
            group_world_size=joined.size,
            master_addr=summary.master_addr,
            master_port=summary.master_port,
            generation=joined.generation,
            role_infos=summary.role_infos(),
            kept=summary.kept(),
        )

    async def _forget_round(self, generation: int) -> None:
        """Delete an old round's keys, so a long job's store does not grow with every
        restart (the round before ours stays: a late reader may still want it)."""
        if generation < 0:
            return
        try:
            await self.store.delete_prefix(self._keys.round(generation))
        except StoreError as exc:  # a few keys left behind; the job does not care
            log.debug("Rendezvous %s: could not delete round %d: %s", self._run_id, generation, exc)

    def _rounds_or_fail(self) -> Rounds:
        if self._rounds is None:
            raise RuntimeError("the rendezvous has not opened its store yet")
        return self._rounds

    async def _join_until_member(self) -> Round:
        """Join rounds until one completes with us in it. A store out of reach is waited for
        until the join timeout, the first time too: its host may start after this agent."""
        rounds = self._rounds_or_fail()
        while True:
            try:
                if self._unended is not None:  # the round we were cut off from: end it
                    await rounds.advance(self._unended, "a member lost contact with the store")
                    self._unended = None
                joined = await rounds.join()
            except StoreUnavailable as exc:
                self._store_problem = str(exc)
                self._problems.warning(
                    "unreachable",
                    "Rendezvous %s: the store is unreachable (%s); trying again until the "
                    "join timeout (%gs)%s",
                    self._run_id,
                    exc,
                    self.settings.join_timeout,
                    "" if self._joined_once else ": its host may not have started yet",
                )
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if joined is not None:
                self._store_problem = ""
                return joined

    async def round_over(self) -> str:
        current = self._round
        membership = self._membership
        if current is None or membership is None:
            raise RuntimeError("round_over() needs a completed rendezvous")
        watch = RoundWatch(
            self.store,
            self._keys,
            current,
            self._run_id,
            self.end_round,
            self._raise_if_failed,
            self._problems,
        )
        self._round_watch = watch  # its successors' ids serve the exit barrier
        watch_task, lost = await first_done(watch.reason(), membership.lost())
        self._rounds_or_fail().finished_peers = (current.generation, frozenset(watch.finished))
        if lost.done() and not lost.cancelled():
            membership.member = False
            self._unended = current.generation
            if membership.told_expired and (why := await watch.store_lost_round()):
                log.info("Rendezvous %s: %s; our heartbeat went with it", self._run_id, why)
                return why  # as designed, and as the round watch says it when it sees it first
            log.warning(
                "Rendezvous %s: no longer a member of round %d: %s",
                self._run_id,
                current.generation,
                lost.result(),
            )
            return f"membership lost: {lost.result()}"
        return watch_task.result()

    async def num_nodes_waiting(self) -> int:
        current = self._round
        if current is None:
            return 0
        joined = await self.store.get(self._keys.round(current.generation, "join"))
        return max(0, int(joined or 0) - current.size)

    # -- joining -----------------------------------------------------------------------------

    async def _open(self) -> None:
        if self._store is not None:
            return
        opened = self._opened = await self._open_store()
        self._store = opened.store
        if self._observer is not None and hasattr(self._store, "observer"):
            self._store.observer = self._observer
        settings = self.settings
        membership = self._membership = Membership(
            opened.store,
            self._keys.heartbeat(self.node_id),
            self._beat,
            settings.heartbeat_ttl,
            settings.keep_alive_interval,
            lease=opened.remote,
            single_process=opened.single_process,
            where=opened.where,
        )
        for listener in self._lease_listeners:
            membership.on_lease(listener)
        # the store's candidate list grows after a round: the will follows it, at once
        # where this agent serves the store (its host's loss is what the list is for)
        membership.on_lease(lambda _deadline: self._tell_will(self._round is not None))
        if opened.on_candidates is not None:
            opened.on_candidates(lambda: self._tell_will(self._round is not None))
        membership.start()
        self._node = {
            "node": self.node_id,
            "role": self._role,
            "addr": self._addr,
            "nproc": self._local_world_size,
            "port": self._master_port or 0,
        }
        node = self._node
        self.announce_kept(self._kept)
        limits = RoundSettings(
            settings.min_nodes,
            settings.max_nodes,
            settings.last_call_timeout,
            settings.join_timeout,
            settings.heartbeat_ttl,
        )
        self._rounds = Rounds(
            self._run_id, opened.store, self._keys, limits, membership, node, opened.prepare
        )
        if opened.hosted and self._keeper is not None:  # a restart here forgets the run
            memory = self._memory = HostMemory(
                self._keeper, self._run_id, settings.keep_alive_interval, opened.hosting
            )
            now = asyncio.get_running_loop().time()
            await memory.restore(
                self._rounds, opened.store, self._keys, settings.heartbeat_ttl, now
            )
            membership.on_lease(memory.renewed)

    def _raise_if_failed(self, closed: bytes) -> None:
        """A peer failed for good: the job is over here too (a peer's success is not: our
        workers may still be running when it leaves the exit barrier)."""
        error = closed_error(self._run_id, closed)
        if not error.succeeded:
            self._closed = True  # nobody left to tell when we leave
            raise error
