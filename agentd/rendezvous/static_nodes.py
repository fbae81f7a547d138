"""The static rendezvous of several nodes: node rank 0's agent serves the job's store, and
the agents meet in it at every attempt.

As torchrun's static backend, the agent of ``--node-rank 0`` serves a TCPStore at
``--master-addr``/``--master-port`` for its whole life, and the workers meet in it too
(``TORCHELASTIC_USE_AGENT_STORE=True``). torch's workers do not tell their attempts apart
in that store (torch 2.13 expects a new store for every attempt), so here the attempts
are agreed: a node that restarts its workers says so in the store, which ends the
current round on every other node (:meth:`round_over`, watched, not polled); each agent
stops its workers and arrives at the next round; once all have arrived, node 0 clears
the workers' keys, and only then do any new workers start. So no worker ever meets
another attempt's keys or processes. (torchrun keeps one store for every attempt: a node
that restarts first can meet the last attempt's keys, and its restarts fail now and then.)

At the first round each agent claims its node rank, with its role and worker count, and
waits (``rdzv_conf`` ``timeout``, 600 s as torch's) until every rank of ``--nnodes`` is
claimed: nodes may run different ``--nproc-per-node``; a node given a rank another live
agent holds is told so, and so are nodes given different ``--nnodes``
(:mod:`~agentd.rendezvous.static_claims`). The nodes of a static job never change: later
rounds reuse the claims. An agent that comes back after its old self was killed takes
its rank over: it ends the round its old self was in, and meets the others at the next
one (a round counts one arrival per node rank, so an old self that arrived before it died
is not counted twice). Node 0's agent started again serves a new, empty store: the others
stop their workers when theirs goes, wait for the new one, and meet there as at the first
round. A node that gives up closes the job for all. When the workers have
all succeeded the agents meet once more (the exit barrier), so node 0 keeps the store up
until every node's workers are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousTimeoutError,
)
from agentd.rendezvous.static_claims import (
    CLOSED,
    CURRENT,
    PREFIX,
    REPORT_EVERY,
    end_old_round,
    finished_key,
    first_of,
    node_key,
    released,
    round_key,
    who,
)
from agentd.rendezvous.static_meeting import DEFAULT_TIMEOUT, StaticNodesMeeting

if TYPE_CHECKING:
    from agentd.rendezvous.drains import Drains
    from agentd.rendezvous.static_drains import StaticDrainStore
    from agentd.tcpstore.client import TCPStoreClient

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT", "StaticNodesRendezvous", "node_key", "round_key"]


class StaticNodesRendezvous(StaticNodesMeeting):
    """Node ``node_rank`` of ``nnodes`` (> 1), meeting at ``master_addr:master_port``
    (see the module docstring)."""

    _drain_store: StaticDrainStore | None = None
    _drains: Drains | None = None

    def drains(self) -> Drains:
        """The drain protocol among the job's nodes, named by their node ranks, in node 0's
        store (:mod:`~agentd.rendezvous.static_drains`; built on the first call)."""
        if self._drains is None:
            from agentd.rendezvous.drains import Drains
            from agentd.rendezvous.keys import RunKeys
            from agentd.rendezvous.static_drains import StaticDrainStore

            store = self._drain_store = StaticDrainStore(
                self._master_addr, lambda: self.master_port
            )
            ranks = [str(rank) for rank in range(self._nnodes)]

            async def members() -> list[str]:
                return ranks  # a static job's nodes never change

            self._drains = Drains(
                lambda: store, RunKeys(self._run_id), ranks[self._node_rank], members
            )
        return self._drains

    async def next_rendezvous(self) -> RendezvousInfo:
        if self._infos is None:
            self._infos = await self._meet()  # every rank claimed: all are at round 0
            assert self._infos is not None
            self._round = 0
            if self._replacing:  # the others were at a round with our old self
                self._round = await self._take_place() + 1
                await self._arrive(self._round)
        else:
            try:
                await self._arrive(self._round + 1)
                self._round += 1
            except RendezvousConnectionError as exc:
                if self._node_rank == 0:
                    raise
                infos = await self._meet_again(exc)
                if infos is None:  # the same store, reached again: its rounds go on
                    await self._arrive(self._round + 1)
                    self._round += 1
                else:
                    self._infos, self._base, self._round = infos, self._generation + 1, 0
        self._generation = self._base + self._round
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=self._node_rank,
            group_world_size=self._nnodes,
            master_addr=self._master_addr,
            master_port=self.master_port,
            generation=self._generation,
            role_infos=self._infos,
        )

    async def round_over(self) -> str:
        """Once another node restarts its workers (RendezvousClosedError: it gave up)."""
        try:
            why = await self._first_of(round_key(self._round, "over"), None)
        except (ConnectionError, OSError, TimeoutError) as exc:
            if self._node_rank == 0:
                raise self._lost(exc) from None
            return f"the job's store at {self._where()} is gone ({exc})"  # node 0 may be back
        return (why or b"").decode() or "a node restarts its workers"

    async def end_round(self, reason: str) -> None:
        """Tell the other nodes at once (they stop their workers and meet at the next round)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._store().set(round_key(self._round, "over"), reason.encode())

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        """A job that failed here fails everywhere: the other nodes stop waiting for this one."""
        if not succeeded and self._client is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await self._client.set(CLOSED, reason.encode() or b"closed")

    async def exit_barrier(self) -> None:
        """Wait until every node's workers have succeeded, or a node that failed for good
        closes the job (the agent bounds the wait; it used to wait all of it then)."""
        client = self._client
        if client is None:
            return
        self._finished = True
        try:
            await client.set(finished_key(self._node_rank), b"1")
            log.info(
                "[%s] Node rank %d's workers are done; waiting for those of the other %d "
                "node(s) (exit barrier)",
                self._role,
                self._node_rank,
                self._nnodes - 1,
            )
            await self._first_of([finished_key(rank) for rank in range(self._nnodes)], None)
        except RendezvousClosedError as exc:
            log.warning("Exit barrier: %s; not waiting for the other nodes", exc)
        except (ConnectionError, OSError) as exc:  # node 0 left: nobody is left to wait for
            log.info("Exit barrier: the job's store at %s is gone (%s)", self._where(), exc)

    async def finished(self) -> list[int]:
        """The node ranks whose workers succeeded (they wait in their exit barrier, or have
        left), which never run again; empty when the store cannot say."""
        client = self._client
        others = [rank for rank in range(self._nnodes) if rank != self._node_rank]
        if client is None or not others:
            return []
        try:
            done = await client.multi_get([finished_key(rank) for rank in others])
        except (ConnectionError, OSError):
            return []
        return [rank for rank, value in zip(others, done, strict=True) if value]

    def min_nodes(self) -> int:
        """Every node: a static job runs at one size."""
        return self._nnodes

    async def shutdown(self) -> None:
        """Leave. An agent that leaves before the job ends (a signal, an error) gives its
        rank back and ends the round: the other nodes stop their workers at once, and wait
        at the next round for an agent to take its place (a pod made again, a restart), as
        they do for one killed. A failure for good closes the job (:meth:`set_closed`)."""
        await self.job.close()
        if self._drain_store is not None:
            await self._drain_store.close()
        client, self._client = self._client, None
        await self._stop_beat()
        if client is not None:
            if self._claimed and not self._finished:
                with contextlib.suppress(ConnectionError, OSError):
                    await self._give_rank_back(client)
            await client.close()
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    async def leaving_soon(self) -> None:
        """Stopped on a signal: give the rank back and end the round now, before our workers
        stop, so the other nodes re-form at once (without spending a restart) rather than
        count our workers' end as their own workers' failure."""
        if self._client is not None and self._claimed and not self._finished:
            with contextlib.suppress(ConnectionError, OSError):
                await self._give_rank_back(self._client)

    async def _give_rank_back(self, client: TCPStoreClient) -> None:
        rank = self._node_rank
        await client.compare_set(node_key(rank), self._claim, released(self._claim))
        self._claimed = False  # given back: nothing is left to give at the shutdown
        why = f"node rank {rank}'s agent left; an agent may take its place".encode()
        await client.compare_set(round_key(max(0, self._round), "over"), b"", why)
        log.info(
            "[%s] Gave node rank %d back: the other nodes wait for an agent to take its place "
            "(rdzv_conf timeout=%gs)",
            self._role,
            rank,
            self._timeout,
        )

    # -- the rounds --------------------------------------------------------------------------

    async def _arrive(self, generation: int) -> None:
        """Meet every node at round ``generation`` (this one's workers are stopped)."""
        client = self._store()
        deadline = asyncio.get_running_loop().time() + self._timeout
        here = [round_key(generation, f"here/{rank}") for rank in range(self._nnodes)]
        try:
            (holder,) = await client.multi_get([node_key(self._node_rank)])
            if holder != self._claim:
                self._claimed = False  # the job goes on with the agent that took our place
                raise RendezvousClosedError(
                    f"static rendezvous: node rank {self._node_rank} was taken over by "
                    f"{who(holder)}, which judged this agent gone (its beat stood still)"
                )
            ended = round_key(generation - 1, "over")  # unless end_round said why already
            await client.compare_set(ended, b"", b"a node restarts its workers")
            await client.set(here[self._node_rank], self._token.encode())
            if self._node_rank == 0:
                await self._until(here, deadline, generation)
                assert self._server is not None
                self._server.clear_except(PREFIX)  # no worker of an earlier round is left
                await client.set(CURRENT, str(generation).encode())
                await client.set(round_key(generation, "go"), b"1")
            await self._until([round_key(generation, "go")], deadline, generation)
        except (ConnectionError, OSError, TimeoutError) as exc:
            raise self._lost(exc) from None

    async def _take_place(self) -> int:
        """Take our gone old self's place: end the round it was in (or had run), which the
        others then leave, and return that round's generation; an old self whose workers had
        succeeded leaves nothing to run (RendezvousClosedError, as succeeded)."""
        try:
            return await end_old_round(self._store(), self._node_rank, self._replacing)
        except (ConnectionError, OSError) as exc:
            raise self._lost(exc) from None
        except RendezvousClosedError:
            self._finished = True  # (and nobody waits for us: our old self's key counts)
            raise

    async def _until(self, keys: list[str], deadline: float, generation: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            left = max(0.0, deadline - loop.time())
            if await self._first_of(keys, min(left, REPORT_EVERY)) is not None:
                return
            if loop.time() >= deadline:
                raise RendezvousTimeoutError(
                    f"static rendezvous: not every node of --nnodes {self._nnodes} restarted "
                    f"its workers within {self._timeout:g}s (rdzv_conf timeout; round "
                    f"{generation})"
                )
            here = [round_key(generation, f"here/{rank}") for rank in range(self._nnodes)]
            arrived = [rank for rank, v in enumerate(await self._store().multi_get(here)) if v]
            log.info(
                "[%s] Waiting for the other nodes to restart their workers: %d of %d at "
                "round %d (node ranks %s not yet)",
                self._role,
                len(arrived),
                self._nnodes,
                generation,
                sorted(set(range(self._nnodes)) - set(arrived)),
            )

    async def _first_of(self, keys: str | list[str], seconds: float | None) -> bytes | None:
        return await first_of(self._master_addr, self.master_port, keys, seconds)
