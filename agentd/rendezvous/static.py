"""The static rendezvous: a fixed set of nodes that know their ranks, no store, no peers' news.

The base of what ``--rdzv-backend static`` (torchrun's default) builds: each node is told
``--node-rank`` of a fixed ``--nnodes N`` and where group rank 0's workers listen
(``--master-addr``/``--master-port``). This class alone exchanges nothing and leaves the
workers' store to rank 0's worker; ``agentd run`` builds its subclasses, in which the
agent serves it, as torchrun's does: :mod:`agentd.rendezvous.solo` for one node,
:mod:`agentd.rendezvous.static_nodes` for several.
"""

from __future__ import annotations

import asyncio
import socket

from agentd.rendezvous.api import RendezvousInfo, RoleInstanceInfo


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the workers' own store binds it)."""
    with reserve_port(host) as sock:
        return int(sock.getsockname()[1])


def reserve_port(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port), not yet listening: the port stays
    ours until the socket is closed or listens (the agent's store for the workers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class StaticRendezvous:
    """Group rank ``node_rank`` of ``nnodes``, each node running ``local_world_size`` workers.

    ``master_port`` pins the workers' port; without one (only allowed for one node) each
    round picks a free port, so a restarted group never trips over its predecessor's
    socket in TIME_WAIT.
    """

    def __init__(
        self,
        run_id: str,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        *,
        node_rank: int = 0,
        nnodes: int = 1,
        role: str = "default",
        local_world_size: int = 1,
    ) -> None:
        if nnodes > 1 and not master_port:
            raise ValueError("a static rendezvous of several nodes needs a fixed master_port")
        self._run_id = run_id
        self._master_addr = master_addr
        self._master_port = master_port
        self._node_rank = node_rank
        self._nnodes = nnodes
        self._role = role
        self._local_world_size = local_world_size
        self._generation = -1

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self._run_id

    def bind_worker_spec(self, role: str, local_world_size: int) -> None:
        """The agent's role and worker count, for a handler built before its spec."""
        self._role, self._local_world_size = role, local_world_size

    @property
    def use_agent_store(self) -> bool:
        return False

    async def next_rendezvous(self) -> RendezvousInfo:
        self._generation += 1
        port = self._master_port or self._pick_port()
        infos = tuple(
            RoleInstanceInfo(self._role, rank, self._local_world_size)
            for rank in range(self._nnodes)
        )
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=self._node_rank,
            group_world_size=self._nnodes,
            master_addr=self._master_addr,
            master_port=port,
            generation=self._generation,
            role_infos=infos if self._nnodes > 1 else (),
        )

    def _pick_port(self) -> int:
        """A port for this round's workers' store, none being pinned."""
        return free_port(self._master_addr)

    async def round_over(self) -> str:
        await asyncio.Future()  # a static rendezvous hears nothing from its peers
        raise AssertionError("unreachable")

    async def end_round(self, reason: str) -> None:
        """No channel to the peers: they learn of it through their collectives."""

    async def num_nodes_waiting(self) -> int:
        return 0

    async def exit_barrier(self) -> None:
        """No store to meet in: each node leaves when its workers are done."""

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        """Nothing to close."""

    async def shutdown(self) -> None:
        """Nothing to release: a static rendezvous holds no connection."""
