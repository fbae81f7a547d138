"""The rendezvous seam: a small protocol the agent drives, one implementation per backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class RoleInstanceInfo:
    """What one agent contributes to rank assignment: its role, group rank and worker count."""

    role: str
    rank: int
    local_world_size: int


@dataclass(frozen=True)
class RendezvousInfo:
    """The outcome of one rendezvous round, for this agent."""

    run_id: str
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    generation: int = 0
    store: Any = None
    role_infos: tuple[RoleInstanceInfo, ...] = ()
    """Every agent's role info, by group rank, when the backend gathers them (else empty)."""


class RendezvousHandler(Protocol):
    """What the agent needs from a rendezvous backend."""

    def get_backend(self) -> str: ...

    def get_run_id(self) -> str: ...

    @property
    def use_agent_store(self) -> bool: ...

    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return its outcome once it completes."""
        ...

    async def num_nodes_waiting(self) -> int:
        """How many nodes wait to join: > 0 makes a healthy group restart to admit them."""
        ...

    def needs_membership_checks(self) -> bool:
        """Whether the agent must call :meth:`num_nodes_waiting` while the group runs."""
        ...

    async def exit_barrier(self) -> None:
        """Return once every agent of this round is done (the caller bounds the wait)."""
        ...

    async def shutdown(self) -> None: ...
