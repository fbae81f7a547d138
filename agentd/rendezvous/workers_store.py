"""The workers' store service: group rank 0's agent serves the store its workers' process
group meets in (:mod:`agentd.tcpstore.server`), a new one for every attempt (a rendezvous
that serves one store for all its attempts, :class:`~agentd.rendezvous.api.HostsWorkersStore`,
is left to it).

A store opens just before its attempt's workers start, and closes when the next attempt's
opens, when the agent shuts down (after the exit barrier), or when it stops its workers
(:meth:`WorkerStoreService.close`, once the survivors were asked to park): the attempt is
over on every node then, and a survivor blocked in the store (an ``init_process_group``
waiting for a rank that is gone) fails at once and parks, where it would wait out its
timeout. A worker of an earlier attempt can never reach a later store: it has a new
port, or, with a pinned ``--master-port``, is a new listener on it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentd.rendezvous.api import HostsWorkersStore, ReservesMasterPort, agent_serves_store
from agentd.support import fdlimits
from agentd.tcpstore.server import MAX_CONNECTIONS, TCPStoreServer

if TYPE_CHECKING:
    import socket

    from agentd.group import WorkerGroup
    from agentd.view import AgentView

log = logging.getLogger(__name__)


@runtime_checkable
class NamesItsAddress(Protocol):
    """A rendezvous whose store address is the user's to give, and may be one this host
    lacks (a job of one node): the option that gave it is named where it cannot be served."""

    addr_flag: str


def store_server(
    host: str, port: int, workers: int, sock: socket.socket | None = None
) -> TCPStoreServer:
    """A workers' store for ``host:port`` (or the reserved ``sock``), taking as many
    connections as the open-files limit allows beside this host's ``workers``."""
    cap = fdlimits.listener_cap(
        MAX_CONNECTIONS,
        fdlimits.raise_open_files_limit(),
        fdlimits.worker_reserve(workers),
        share=0.5,
    )
    return TCPStoreServer(host, port, sock=sock, max_connections=cap)


class WorkerStoreService:
    """Serves ``agent``'s workers' store whenever it is group rank 0 (and its rendezvous
    wants an agent store: torch's ``use_agent_store``)."""

    def __init__(self, agent: AgentView) -> None:
        self._agent = agent
        self.server: TCPStoreServer | None = None

    async def start(self) -> None:
        """Nothing until an attempt needs it."""

    async def stop(self) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the attempt's store, if this agent serves one, and every connection to it."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop()

    async def open_for(self, group: WorkerGroup) -> None:
        """The store of the attempt about to start: this agent's if it is group rank 0."""
        await self.close()
        handler = self._agent.rdzv_handler
        if isinstance(handler, HostsWorkersStore):
            return  # it serves its own, for every attempt
        if not agent_serves_store(handler, group.spec.master_addr) or group.group_rank != 0:
            return
        host, port = str(group.master_addr), int(group.master_port or 0)
        sock = handler.take_master_socket(port) if isinstance(handler, ReservesMasterPort) else None
        server = store_server(host, port, group.spec.local_world_size, sock)
        given = group.spec.master_port and sock is None  # the user's port: name the flag
        addr_flag = handler.addr_flag if isinstance(handler, NamesItsAddress) else None
        await server.start("--master-port" if given else "workers' store", addr_flag)
        self.server = server
        log.info("[%s] Serving the workers' store on %s:%d", group.spec.role, host, server.port)
