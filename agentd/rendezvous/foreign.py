"""A torch-style rendezvous handler (synchronous methods) driven from agentd's loop.

Sites have their own ``RendezvousHandler`` subclasses, written for torch's agent, which
calls them synchronously. :class:`SyncRendezvousHandler` gives agentd's agent the async
protocol of :mod:`agentd.rendezvous.api` on top of one: each call runs in a worker thread,
so a handler that blocks for minutes in ``next_rendezvous()`` never stalls the loop.

What torch's handler protocol offers, and so what such a handler gets: rounds from
``next_rendezvous()`` (torch's ``RendezvousInfo``, or the older ``(store, rank,
world_size)`` tuple); membership changes noticed by polling ``num_nodes_waiting()`` as
torch's agent does (every ``poll_interval`` seconds), and ``is_closed()`` as a peer's
failure for good; ``set_closed()`` and ``shutdown()``. Every node is assumed to run as
many workers as this one (torch's handler cannot tell otherwise without its agent's store
protocol), and the workers' store is hosted by rank 0's worker
(``TORCHELASTIC_USE_AGENT_STORE=False``) at the master address the round gives.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import anyio.to_thread

from agentd.rendezvous.api import RendezvousClosedError, RendezvousInfo


class SyncRendezvousHandler:
    """agentd's rendezvous protocol over a torch-style handler (see the module doc)."""

    def __init__(self, handler: Any, poll_interval: float = 1.0) -> None:
        for name in ("next_rendezvous", "get_run_id", "get_backend"):
            if not callable(getattr(handler, name, None)):
                raise TypeError(
                    f"rdzv_handler: {handler!r} has no {name}() method; it must "
                    "be a rendezvous handler"
                )
        self.handler = handler
        self.poll_interval = poll_interval
        self._local_world_size = 1
        self._role = "default"
        self._generation = -1

    def bind_worker_spec(self, role: str, local_world_size: int) -> None:
        self._role, self._local_world_size = role, local_world_size

    async def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.handler, name)
        return await anyio.to_thread.run_sync(
            functools.partial(method, *args), abandon_on_cancel=True
        )

    def get_backend(self) -> str:
        return str(self.handler.get_backend())

    def get_run_id(self) -> str:
        return str(self.handler.get_run_id())

    @property
    def use_agent_store(self) -> bool:
        return False

    async def next_rendezvous(self) -> RendezvousInfo:
        from agentd.rendezvous.api import RoleInstanceInfo

        info = await self._call("next_rendezvous")
        if isinstance(info, tuple):  # torch before 2.4: (store, rank, world_size)
            store, rank, world_size = info
            bootstrap = None
        else:
            store, rank, world_size = info.store, info.rank, info.world_size
            bootstrap = getattr(info, "bootstrap_store_info", None)
        if bootstrap is not None:
            addr, port = str(bootstrap.master_addr), int(bootstrap.master_port)
        else:
            addr, port = await anyio.to_thread.run_sync(_master_from_store, store, rank)
        self._generation += 1
        lws = self._local_world_size
        return RendezvousInfo(
            run_id=self.get_run_id(),
            group_rank=int(rank),
            group_world_size=int(world_size),
            master_addr=addr,
            master_port=port,
            generation=self._generation,
            store=store,
            role_infos=tuple(RoleInstanceInfo(self._role, r, lws) for r in range(world_size)),
        )

    async def round_over(self) -> str:
        while True:
            await asyncio.sleep(self.poll_interval)
            if await self._call("is_closed"):
                raise RendezvousClosedError("the rendezvous was closed by another node")
            waiting = await self._call("num_nodes_waiting")
            if waiting > 0:
                return f"{waiting} node(s) waiting to join"

    async def end_round(self, reason: str) -> None:
        """torch's handlers have no such call: the peers learn through their workers."""

    async def num_nodes_waiting(self) -> int:
        return int(await self._call("num_nodes_waiting"))

    async def exit_barrier(self) -> None:
        """No barrier: torch's handler protocol has none (torch's agent uses its store)."""

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        if succeeded or not await self._call("is_closed"):
            await self._call("set_closed")

    async def shutdown(self) -> None:
        shutdown = getattr(self.handler, "shutdown", None)
        if callable(shutdown):
            await self._call("shutdown")


def _master_from_store(store: Any, rank: int) -> tuple[str, int]:
    """torch's fallback when a round names no master: rank 0 publishes a free port on its
    address in the round's store, the others read it."""
    from agentd.rendezvous.static import free_port

    if rank == 0:
        import socket

        addr = socket.getfqdn()
        store.set("MASTER_ADDR", addr.encode())
        store.set("MASTER_PORT", str(free_port(addr)).encode())
    return store.get("MASTER_ADDR").decode(), int(store.get("MASTER_PORT").decode())
