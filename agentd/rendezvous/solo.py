"""The rendezvous of a job of one node: ``--standalone``, or ``static`` with ``--nnodes 1``
(torchrun's default command line). No peers, no store to meet in.

torchrun's ``--standalone`` runs its c10d rendezvous against a store on localhost that no
other agent can reach, and its ``static`` one of one node a store that only this agent
uses; here a job of one node skips the membership machinery (leases, rounds, roll calls,
releases) it could never use. What the job still sees is what it gets under torchrun: its
agent serves the workers' store (``use_agent_store``), a new one each attempt, on a port
reserved for it (or the one ``--master-port`` pins), and the backend reports itself as
``agentd`` (``--standalone``) or ``static``. A drain still works: it is agreed, among this
node's workers alone, in a store inside the agent, built when first asked for.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from agentd.exceptions import StartError
from agentd.rendezvous.static import StaticRendezvous, reserve_port

if TYPE_CHECKING:
    from agentd.rendezvous.drains import Drains
    from agentd.store.memory import MemoryStore


class SoloRendezvous(StaticRendezvous):
    """A rendezvous of this node alone (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        addr: str = "127.0.0.1",
        master_port: int | None = None,
        *,
        backend: str = "agentd",
        addr_flag: str = "--local-addr",
    ) -> None:
        super().__init__(run_id, addr, master_port)
        self._backend = backend
        self.addr_flag = addr_flag
        """The flag that gave ``addr``, named when this host cannot listen on it."""
        self.node_id = f"{socket.gethostname()}_{os.getpid()}_{os.urandom(3).hex()}"
        self._reserved: socket.socket | None = None
        self._store: MemoryStore | None = None
        self._drains: Drains | None = None

    def get_backend(self) -> str:
        return self._backend

    @property
    def use_agent_store(self) -> bool:
        return True

    def _pick_port(self) -> int:
        """A port held (bound, not listening) until the workers' store takes it over."""
        self._release_reserved()
        self._reserved = self._bind()
        return int(self._reserved.getsockname()[1])

    def _bind(self) -> socket.socket:
        """A socket bound to a free port of our address; StartError naming the flag that
        gave the address where this host has no such address (a typo, another host's)."""
        try:
            return reserve_port(self._master_addr)
        except OSError as exc:
            raise StartError(
                f"{self.addr_flag}: {self._master_addr!r} is not an address of this host "
                f"({exc.strerror})"
            ) from None

    def take_master_socket(self, port: int) -> socket.socket | None:
        """The socket reserved for the workers' store of this attempt, if ``port`` is its
        port (the caller owns it then)."""
        sock, self._reserved = self._reserved, None
        if sock is not None and sock.getsockname()[1] != port:
            sock.close()
            return None
        return sock

    def drains(self) -> Drains:
        """The drain protocol, among this node's workers (its store is built on the first
        call: the agent asks only when this node drains)."""
        if self._drains is None:
            from agentd.rendezvous.drains import Drains
            from agentd.rendezvous.keys import RunKeys
            from agentd.store.memory import MemoryStore

            store = self._store = MemoryStore(stall_guard=False)

            async def members() -> list[str]:
                return [self.node_id]

            self._drains = Drains(lambda: store, RunKeys(self._run_id), self.node_id, members)
        return self._drains

    async def shutdown(self) -> None:
        self._release_reserved()
        if self._store is not None:
            await self._store.close()

    def _release_reserved(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
