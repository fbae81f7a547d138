"""A static job's agent and node 0's store: connecting to it (node 0's agent serves it),
claiming the node rank there (:mod:`~agentd.rendezvous.static_claims`), the first round,
and meeting again in a new store once node 0's agent is started again. The base of
:class:`~agentd.rendezvous.static_nodes.StaticNodesRendezvous`, which runs the rounds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from agentd.exceptions import StartError
from agentd.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousTimeoutError,
    RoleInstanceInfo,
)
from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.static import StaticRendezvous
from agentd.rendezvous.static_claims import (
    BEAT_EVERY,
    REPORT_EVERY,
    beat,
    claim,
    node_key,
    role_infos,
    take_rank,
    wait_for_claims,
)
from agentd.rendezvous.static_job import StaticJobRecords
from agentd.support.net import is_loopback

if TYPE_CHECKING:
    from agentd.tcpstore.client import TCPStoreClient
    from agentd.tcpstore.server import TCPStoreServer

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0
"""Seconds an agent waits for node 0's store and for every node's claim (torch's)."""


class StaticNodesMeeting(StaticRendezvous):
    """Node ``node_rank`` of ``nnodes`` (> 1), connected to node 0's store at
    ``master_addr:master_port`` (see the module docstring); ``local_addr`` is where the
    other nodes reach this one (the job view's links to its health endpoint), whose
    records this store keeps too (:mod:`~agentd.rendezvous.static_job`)."""

    def __init__(
        self,
        run_id: str,
        master_addr: str,
        master_port: int,
        *,
        node_rank: int,
        nnodes: int,
        role: str = "default",
        local_world_size: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        local_addr: str | None = None,
    ) -> None:
        super().__init__(
            run_id,
            master_addr,
            master_port,
            node_rank=node_rank,
            nnodes=nnodes,
            role=role,
            local_world_size=local_world_size,
        )
        self._timeout = timeout
        self._server: TCPStoreServer | None = None
        self._client: TCPStoreClient | None = None
        self._infos: tuple[RoleInstanceInfo, ...] | None = None
        self._token = os.urandom(6).hex()  # tells this agent's claim from any other's
        self._claim = claim(role, local_world_size, nnodes, self._token)
        self._claimed = False  # the rank is ours: leaving before the end ends the job
        self._replacing = ""  # whose rank we took over, and why it counted as gone
        self._beat: asyncio.Task[None] | None = None
        self._finished = False  # its workers succeeded: at the exit barrier, or past it
        self._round = -1  # in the store of node 0's agent: it counts from 0 in a new one
        self._base = 0  # our generation at that store's round 0
        addr = local_addr or ("127.0.0.1" if is_loopback(master_addr) else socket.getfqdn())
        node_id = f"{socket.gethostname()}_{os.getpid()}_{self._token[:6]}"
        self.job = StaticJobRecords(
            master_addr, lambda: self.master_port, node_id, addr, lambda g: g - self._base
        )
        self.settings = RendezvousSettings(
            min_nodes=nnodes, max_nodes=nnodes, join_timeout=timeout, keep_alive_interval=BEAT_EVERY
        )

    def store_status(self) -> dict[str, Any] | None:
        """Where node 0's agent serves the job's store (the job view's header)."""
        return {"where": self._where()}

    @property
    def use_agent_store(self) -> bool:
        return True

    def hosts_workers_store(self) -> bool:
        return True

    @property
    def master_port(self) -> int:
        """Where node 0's agent serves the job's store (and the workers meet)."""
        return int(self._master_port or 0)

    def _store(self) -> TCPStoreClient:
        if self._client is None:
            raise RendezvousConnectionError("static rendezvous: not connected to the store")
        return self._client

    def _lost(self, exc: BaseException) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"static rendezvous: lost the job's store at {self._where()} ({exc}): node "
            "rank 0's agent ended, and its log says why"
        )

    async def _meet_again(
        self, lost: RendezvousConnectionError
    ) -> tuple[RoleInstanceInfo, ...] | None:
        """Node 0's store is out of reach (its agent was killed, or stopped): wait for node
        0's agent to serve a new one (started again), and meet there as at the first round;
        None where the store that answers still holds our claim (it was the connection)."""
        log.warning(
            "[%s] %s; waiting for it to be started again (rdzv_conf timeout=%gs)",
            self._role,
            lost,
            self._timeout,
        )
        client, self._client = self._client, None
        await self._stop_beat()
        if client is not None:
            await client.close()
        self._claimed = False  # (nothing to give back in a store that is gone)
        return await self._meet(again=True)

    # -- the first round ---------------------------------------------------------------------

    async def _meet(self, again: bool = False) -> tuple[RoleInstanceInfo, ...] | None:
        from agentd.tcpstore.client import TCPStoreClient

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        if self._node_rank == 0:
            await self._serve()
        connecting = asyncio.ensure_future(
            TCPStoreClient.connect(self._master_addr, self.master_port, self._timeout)
        )
        client = None
        try:
            while not (await asyncio.wait({connecting}, timeout=REPORT_EVERY))[0]:
                log.info(
                    "[%s] Waiting for node rank 0's agent to serve the job's store at %s "
                    "(rdzv_conf timeout=%gs)",
                    self._role,
                    self._where(),
                    self._timeout,
                )
            client = connecting.result()
        except TimeoutError as exc:
            raise RendezvousTimeoutError(
                f"static rendezvous: {exc}; node rank 0's agent serves it at --master-addr "
                f"and --master-port (rdzv_conf timeout={self._timeout:g})"
            ) from None
        finally:
            if not connecting.cancel() and not taken(connecting, client):
                await connecting.result().close()  # connected just as we were cancelled
        self._client = client
        try:
            if again and await client.multi_get([node_key(self._node_rank)]) == [self._claim]:
                await self._take_rank(client)  # ours still: the store was not restarted
                return None
            await self._take_rank(client)
            claims = await wait_for_claims(
                client, self._nnodes, deadline, self._where(), self._timeout
            )
        except (ConnectionError, OSError) as exc:
            raise self._lost(exc) from None
        return role_infos(claims, self._nnodes)

    async def _take_rank(self, client: TCPStoreClient) -> None:
        """Claim our node rank (or take it over from a gone agent), then beat for it."""
        self._replacing = await take_rank(client, self._node_rank, self._claim, self._nnodes)
        self._claimed = True
        self._beat = asyncio.ensure_future(beat(self.job.add, self._node_rank))

    async def _stop_beat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)

    async def _serve(self) -> None:
        from agentd.rendezvous.workers_store import store_server
        from agentd.support.net import is_local_address

        # torch's store listens on every interface; an address of this host is enough.
        host = self._master_addr if is_local_address(self._master_addr) else ""
        server = store_server(host, self.master_port, self._local_world_size)
        try:
            await server.start("--master-port")
        except StartError as exc:
            raise StartError(
                f"{exc}: node rank 0 serves the job's store there (is another agent of "
                "this job on this host also --node-rank 0?)"
            ) from None
        self._server = server
        log.info("[%s] Serving the job's store on %s", self._role, self._where())

    def _where(self) -> str:
        return f"{self._master_addr}:{self._master_port}"


def taken(connecting: asyncio.Future[TCPStoreClient], client: TCPStoreClient | None) -> bool:
    """Whether a finished connect left nothing to close: it failed, or its client was
    taken (``client``)."""
    return connecting.cancelled() or connecting.exception() is not None or client is not None
