"""The rendezvous seam: a small protocol the agent drives, one implementation per backend,
and the optional capabilities a backend may add, each declared as a protocol of its own
(the agent asks ``isinstance(handler, Capability)``, never probes for a method)."""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from agentd.exceptions import AgentdError, StartError

if TYPE_CHECKING:
    from agentd.rendezvous.conf import RendezvousSettings
    from agentd.rendezvous.drains import Drains
    from agentd.rendezvous.exclusions import Exclusions
    from agentd.rendezvous.timings import NodeTimings

LOST_REASON = "left (no heartbeat)"
"""How a round ends when a member's lease ran out (its loss, not a restart): the agent
reads it in the reason ``round_over`` gives."""


class RendezvousError(AgentdError):
    """Base of the rendezvous errors (torch's hierarchy)."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous backend could not be reached."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state is corrupt."""


class RendezvousGracefulExitError(RendezvousError):
    """This node left the rendezvous on purpose: the agent ends its run without an error."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed: the job ended (``succeeded``) or a node failed for good."""

    def __init__(self, message: str = "rendezvous closed", succeeded: bool = False) -> None:
        super().__init__(message)
        self.succeeded = succeeded
        self.exit_code = 0 if succeeded else 1


class RendezvousTimeoutError(StartError, RendezvousError):
    """Too few nodes joined within the join timeout."""


@dataclass(frozen=True)
class RoleInstanceInfo:
    """What one agent contributes to rank assignment: its role, group rank and worker count."""

    role: str
    rank: int
    local_world_size: int

    def serialize(self) -> bytes:
        return json.dumps(
            {"role": self.role, "rank": self.rank, "local_world_size": self.local_world_size}
        ).encode()

    @staticmethod
    def deserialize(data: bytes | str) -> RoleInstanceInfo:
        doc = json.loads(data)
        return RoleInstanceInfo(doc["role"], doc["rank"], doc["local_world_size"])

    @staticmethod
    def compare(a: RoleInstanceInfo, b: RoleInstanceInfo) -> int:
        """Order by role, then group rank: -1, 0 or 1."""
        key_a, key_b = (a.role, a.rank), (b.role, b.rank)
        return (key_a > key_b) - (key_a < key_b)

    @staticmethod
    def find_role_boundaries(roles_infos: list[RoleInstanceInfo], role: str) -> tuple[int, int]:
        """First and last index of ``role`` in ``roles_infos``."""
        indexes = [i for i, info in enumerate(roles_infos) if info.role == role]
        return indexes[0], indexes[-1]


@dataclass(frozen=True)
class RendezvousStoreInfo:
    """Where the workers' store is served: torch's master address and port."""

    MASTER_ADDR_KEY: ClassVar[str] = "MASTER_ADDR"
    MASTER_PORT_KEY: ClassVar[str] = "MASTER_PORT"
    master_addr: str
    master_port: int

    @staticmethod
    def build(
        rank: int, store: Any, local_addr: str | None, server_port: int | None = None
    ) -> RendezvousStoreInfo:
        """torch's: rank 0 puts its address (``local_addr``, else this host's FQDN) and
        ``server_port`` (a shared TCPStore's; else a free port) under
        :attr:`MASTER_ADDR_KEY` and :attr:`MASTER_PORT_KEY` in ``store`` (a c10d store:
        ``set`` and ``get`` of bytes); every rank reads them back, waiting as the store's
        ``get`` waits."""
        from agentd.support.net import get_free_port

        if rank == 0:
            addr = local_addr or socket.getfqdn()
            store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, addr.encode())
            port = server_port or get_free_port()
            store.set(RendezvousStoreInfo.MASTER_PORT_KEY, str(port).encode())
        addr = store.get(RendezvousStoreInfo.MASTER_ADDR_KEY).decode()
        text = store.get(RendezvousStoreInfo.MASTER_PORT_KEY).decode()
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise ValueError(f"{RendezvousStoreInfo.MASTER_PORT_KEY}: {text!r} is not a port")
        return RendezvousStoreInfo(addr, int(text))


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
    role_infos: Sequence[RoleInstanceInfo] = ()
    """Every agent's role info, by group rank, when the backend gathers them (else empty)."""
    kept: Sequence[Sequence[int]] = ()
    """Every agent's workers kept across the restart (local ranks), by group rank, when the
    backend carries them (:class:`KeepsWorkers`; else empty)."""

    @property
    def rank(self) -> int:
        """torch's name for :attr:`group_rank`."""
        return self.group_rank

    @property
    def world_size(self) -> int:
        """torch's name for :attr:`group_world_size`."""
        return self.group_world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo:
        """Where the workers' store is served, as torch's ``RendezvousInfo`` says it."""
        return RendezvousStoreInfo(self.master_addr, self.master_port)


class RendezvousHandler(Protocol):
    """What the agent needs from a rendezvous backend."""

    def get_backend(self) -> str: ...

    def get_run_id(self) -> str: ...

    @property
    def use_agent_store(self) -> bool: ...

    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return its outcome once it completes."""

    async def round_over(self) -> str:
        """Return, saying why, once the current round ends for a reason outside this agent:
        a peer failed, a node joined or left. Raises :class:`RendezvousClosedError` when a
        peer failed for good. A rendezvous of one never returns. The agent awaits it while
        its group runs: watched, not polled."""

    async def end_round(self, reason: str) -> None:
        """This agent's group failed and restarts: end the round for every peer at once."""

    async def num_nodes_waiting(self) -> int:
        """How many nodes wait for the next round (torch's query; agentd watches instead)."""

    async def exit_barrier(self) -> None:
        """Return once every agent of this round is done (the caller bounds the wait)."""

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        """Close the rendezvous for good: the job succeeded, or this node failed for good."""

    async def shutdown(self) -> None:
        """Leave: the other agents re-form without this one (unless closed), then release."""


@runtime_checkable
class BindsWorkerSpec(Protocol):
    """A handler built before its agent's spec (torch's registry builds them first)."""

    def bind_worker_spec(self, role: str, local_world_size: int) -> None:
        """The agent's role and worker count, for rank assignment."""


@runtime_checkable
class KeepsWorkers(Protocol):
    """A rendezvous whose rounds tell every member which workers each node kept across a
    restart (in-process restarts), and this node whether a round was sealed without it."""

    def announce_kept(self, local_ranks: Sequence[int]) -> None:
        """The local ranks this node keeps into the rounds it joins from now (none: [])."""

    def sat_out(self) -> bool: ...

    def peer_loss_timeout(self) -> float:
        """Seconds until every member knows that a peer is lost (its lease runs out): how
        long a survivor whose collective failed waits to be told to restart."""


@runtime_checkable
class FindsLostPeers(Protocol):
    """A rendezvous that can tell a peer's loss from a failure of this node's own (see
    :mod:`agentd.rendezvous.roll_call`)."""

    async def roll_call(self, wait: float) -> list[str]:
        """The other members of the current round that did not answer within ``wait``."""

    async def departed(self) -> int:
        """How many members of the current round left it for good (0: none, or unknown)."""

    def min_nodes(self) -> int:
        """The fewest nodes the job runs with."""

    def peer_loss_timeout(self) -> float:
        """Seconds until every member knows that a peer is lost (its lease runs out)."""


@runtime_checkable
class LeasedMembership(Protocol):
    """A rendezvous whose membership is a lease on a heartbeat in a shared store."""

    def on_lease(self, listener: Callable[[float | None], None]) -> None:
        """Tell ``listener`` the lease's end (monotonic seconds) whenever it moves."""

    def lease_deadline(self) -> float | None:
        """When the lease ends (monotonic seconds): no worker may run after it."""

    def on_will(self, listener: Callable[[dict[str, Any] | None], None]) -> None:
        """Tell ``listener`` how to release this agent's membership should it die (a
        document for :mod:`agentd.rendezvous.release`), whenever that changes; None while
        there is nothing another process could release (between rounds, after a clean
        leave, or when this agent serves the store itself)."""

    def membership_lost(self) -> str:
        """Why this agent is no longer a member of its round ('' while it is)."""

    async def workers_stopped(self) -> None:
        """This agent's workers of its round are stopped and it stays out of the next
        rounds for a while: a round sealed without it need not wait for its lease."""


@runtime_checkable
class LeavesSoon(Protocol):
    """A rendezvous told that its agent, stopped on a signal, leaves once its workers are
    stopped (they take a while): the dynamic one stops offering to take over the store now
    (no peer moves it here), a static one gives its rank back and ends the round."""

    async def leaving_soon(self) -> None: ...


@runtime_checkable
class Hurries(Protocol):
    """A rendezvous whose leave may wait for its peers (a store's host in its exit barrier
    keeps the store up until they finish): a second stop request cuts that wait."""

    def hurry(self) -> None: ...


@runtime_checkable
class ReservesMasterPort(Protocol):
    """A rendezvous that binds group rank 0's MASTER_PORT itself, so no other process can
    take it before the workers' store listens on it."""

    def take_master_socket(self, port: int) -> socket.socket | None:
        """The socket bound to ``port`` (the caller owns it then), or None."""


@runtime_checkable
class HostsWorkersStore(Protocol):
    """A rendezvous whose group rank 0 serves the workers' store itself, one store for all
    its attempts (the static rendezvous of several nodes, torch's design): the agent opens
    none of its own, and each attempt's workers meet in it under their own prefix."""

    def hosts_workers_store(self) -> bool:
        """Always True: the method's presence is the declaration."""


@runtime_checkable
class ReportsStore(Protocol):
    """A rendezvous over a networked store, whose requests and state health reports."""

    def observe_store(self, observer: Callable[[str, float], None]) -> None:
        """Tell ``observer`` (operation, seconds) of every store request."""

    def store_status(self) -> dict[str, Any] | None:
        """Which store serves (candidate stores), for /status."""


@runtime_checkable
class KnowsFinishedNodes(Protocol):
    """A rendezvous that can say which members of the round run no more: their workers
    succeeded, and they wait in their exit barrier. A failure after theirs may leave no
    round to restart in."""

    async def finished(self) -> list[int]:
        """Their group ranks, never this node's (empty when the store cannot say)."""

    def min_nodes(self) -> int:
        """The fewest nodes the job runs with."""

    async def num_nodes_waiting(self) -> int: ...


@runtime_checkable
class PublishesExclusions(Protocol):
    """A rendezvous that tells the other agents why a node keeps itself out of the job."""

    exclusions: Exclusions
    """This node's exclusion, and those of the peers the last round lost."""

    async def publish_exclusion(self, doc: dict[str, Any] | None) -> None:
        """Publish this node's exclusion ``doc`` (None: it is back)."""


@runtime_checkable
class ComparesNodes(Protocol):
    """A rendezvous whose store carries each node's compute times
    (:mod:`agentd.rendezvous.timings`), for the job-wide straggler comparison."""

    timings: NodeTimings
    node_id: str

    async def num_nodes_waiting(self) -> int: ...


class StatusRecords(Protocol):
    """The members' status records in the store (the job at a glance); this node's id."""

    node_id: str
    addr: str

    async def publish(
        self, generation: int, rank: int, doc: dict[str, Any], ttl: float
    ) -> None: ...

    async def gather(self, generation: int, size: int) -> tuple[dict[int, dict[str, Any]], int]: ...


@runtime_checkable
class ShowsJob(Protocol):
    """A rendezvous whose store carries each member's status record, for the job at a
    glance (:mod:`agentd.rendezvous.job_records`, :mod:`agentd.rendezvous.static_job`)."""

    job: StatusRecords
    settings: RendezvousSettings

    async def num_nodes_waiting(self) -> int: ...

    def store_status(self) -> dict[str, Any] | None: ...


@runtime_checkable
class CoordinatesDrains(Protocol):
    """A rendezvous whose store carries the drain protocol (:mod:`agentd.rendezvous.drains`)."""

    def drains(self) -> Drains:
        """This node's side of the protocol (built on the first call where that costs)."""


_AGENTD_METHODS = ("next_rendezvous", "round_over", "end_round", "exit_barrier")


def is_agentd_handler(handler: Any) -> bool:
    """True for a handler that speaks agentd's async protocol."""
    return all(
        inspect.iscoroutinefunction(getattr(handler, name, None)) for name in _AGENTD_METHODS
    )


def agent_serves_store(handler: RendezvousHandler, pinned: str | None) -> bool:
    """Whether the agents serve their workers' store (torch's ``use_agent_store``): the
    rendezvous wants an agent store, and the master address the user ``pinned`` (the
    spec's ``master_addr``), if any, names this host. A pinned address elsewhere is the
    user's own: rank 0's worker hosts the store there, as before agents served it."""
    if not handler.use_agent_store:
        return False
    if isinstance(handler, HostsWorkersStore):
        return True  # served wherever the user pinned it: by that rendezvous, for its run
    if not pinned:
        return True
    from agentd.support.net import is_local_address  # only for an address the user pinned

    return is_local_address(pinned)


def fresh_store_each_attempt(handler: RendezvousHandler, pinned: str | None) -> bool:
    """Whether every attempt's workers meet in a new store, the agent's: a kept rank (an
    in-process restart) never sees the last attempt's keys. Not so when a worker hosts the
    store, nor when the rendezvous serves one store for all its attempts."""
    return agent_serves_store(handler, pinned) and not isinstance(handler, HostsWorkersStore)
