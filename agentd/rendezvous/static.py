"""The single-node rendezvous: ``--standalone`` and ``--nnodes 1`` need no peers."""

from __future__ import annotations

import socket

from agentd.rendezvous.api import RendezvousInfo


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the workers' own store binds it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class SingleNodeRendezvous:
    """A rendezvous of one: group rank 0 of 1, with a fresh master port every round.

    ``master_port`` pins the port (``--master-port``); otherwise each round picks a free
    one, so a restarted group never trips over its predecessor's socket in TIME_WAIT.
    """

    def __init__(self, run_id: str, master_addr: str = "127.0.0.1", master_port: int | None = None):
        self._run_id = run_id
        self._master_addr = master_addr
        self._master_port = master_port
        self._generation = -1

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return False

    async def next_rendezvous(self) -> RendezvousInfo:
        self._generation += 1
        port = self._master_port or free_port(self._master_addr)
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=0,
            group_world_size=1,
            master_addr=self._master_addr,
            master_port=port,
            generation=self._generation,
        )

    async def num_nodes_waiting(self) -> int:
        return 0

    def needs_membership_checks(self) -> bool:
        return False

    async def exit_barrier(self) -> None:
        """Nobody else to wait for: a rendezvous of one is done when this agent is."""

    async def shutdown(self) -> None:
        """Nothing to release: a rendezvous of one holds no connection."""
