"""What the local agent calls on each of its services, beyond ``start()``/``stop()``: one
protocol per role, with only the members the agent uses. A service satisfies its
protocol structurally (mypy checks :func:`~agentd.assembly.services.build_services`
against them), so a test or an embedder can hand the agent any object that does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agentd.group import WorkerGroup
    from agentd.health.metrics import AgentMetrics
    from agentd.health.server import Check, HealthCheckServer
    from agentd.heartbeats.stragglers import StepTimes
    from agentd.inprocess.settings import Fallback
    from agentd.timer.file_server import FileTimerServer
    from agentd.wire.progress import ProgressMessage
    from agentd.workers.processes import WorkerProcess

ProgressSink = Callable[["list[ProgressMessage]"], None]


class ResultPort(Protocol):
    """The run's record (``result.json``) and the failure report."""

    file: Any
    written: bool

    def failure_report(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class WatchdogPort(Protocol):
    """The timers' server and the unhealthy workers it reaped."""

    @property
    def timer_server(self) -> FileTimerServer: ...

    @property
    def unhealthy(self) -> list[Any]: ...

    @property
    def timer_file(self) -> str | None: ...

    @property
    def progress_pipe(self) -> str | None: ...

    @property
    def pipe_dir(self) -> str | None: ...

    def on_progress(self, sink: ProgressSink) -> None: ...

    def sweep_stale_pipes(self) -> None: ...

    def forget(self, pids: Iterable[int]) -> None: ...

    def clear(self) -> None: ...

    def reports_to(self, listener: Callable[[Any], None]) -> AbstractContextManager[None]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HeartbeatsPort(Protocol):
    """Hang detection: fed the workers' progress, told when they start and stop."""

    @property
    def step_times(self) -> StepTimes: ...

    def node_sections(self) -> dict[str, float] | None: ...

    def started(
        self,
        group: WorkerGroup,
        procs: list[WorkerProcess],
        resumed: Collection[int] = (),
        preload_s: float = 0.0,
    ) -> None:
        """A new attempt's workers run; ``resumed``: the local ranks that kept their
        process; ``preload_s``: how long this node's zygote took to preload."""
        ...

    async def stopped(self) -> None: ...

    async def where(self, local_ranks: Collection[int]) -> dict[int, str]:
        """Where these workers are now, from a dump of their stacks, by local rank (those
        that could not be dumped are left out)."""
        ...

    def feed(self, messages: list[ProgressMessage]) -> None: ...

    def hold(self, seconds: float | None) -> None: ...

    def beats_due_in(self) -> float | None: ...

    def status(self) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HealthPort(Protocol):
    """The health endpoint, when one was asked for."""

    server: HealthCheckServer | None
    metrics: AgentMetrics | None

    @property
    def url(self) -> str | None: ...

    def liveness_checks(self) -> list[Check]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HygienePort(Protocol):
    """Process hygiene: the reaper's bookkeeping, the guardian, the lease's deadline."""

    def spawning(self) -> AbstractContextManager[None]: ...

    def adopt(self, procs: Sequence[WorkerProcess]) -> None: ...

    async def guarding(self) -> None: ...

    async def started(self, procs: Sequence[WorkerProcess]) -> None: ...

    def stopped(self, procs: Sequence[WorkerProcess]) -> None: ...

    def remove_when_gone(self, path: str) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class WorkerStorePort(Protocol):
    """The workers' TCPStore, opened for each attempt's group."""

    async def open_for(self, group: WorkerGroup) -> None: ...

    async def close(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class PreloadPort(Protocol):
    """The zygote that forks workers, when the spec preloads modules."""

    enabled: bool

    @property
    def forks(self) -> bool:
        """Whether the next attempt's workers are forked from the zygote."""
        ...

    def first_started(self, may_restart: bool) -> None:
        """The first attempt's workers run (a bare zygote starts now if ``may_restart``)."""
        ...

    async def spawn(self, local_rank: int, *launch: Any) -> WorkerProcess: ...

    async def ready(self) -> None:
        """Wait until a worker can be forked at once (the preload is done)."""
        ...

    @property
    def preload_seconds(self) -> float:
        """The longest a zygote of this agent took to preload (0.0: none yet)."""
        ...

    def status(self) -> dict[str, Any] | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class InProcessPort(Protocol):
    """In-process restarts: which workers park, and which resume in the next attempt."""

    parked: dict[int, WorkerProcess]
    kinds: dict[str, int]
    fallbacks: dict[str, int]
    last_fallback: Fallback | None

    def restarting(self) -> AbstractContextManager[None]: ...

    def plan(
        self,
        plans: list[tuple[Any, ...]],
        kept_ranks: frozenset[int] | None,
        peer_loss: float,
        round_: int = 0,
        stale: bool = False,
    ) -> None: ...

    def keeping(self) -> list[int]: ...

    def unresumable(self) -> list[WorkerProcess]: ...

    async def see_exits(self, procs: Iterable[WorkerProcess], cause_wait: float) -> None: ...

    def resume_all(self, plans: Sequence[tuple[Any, ...]]) -> list[WorkerProcess]: ...

    def spawned(self, local_ranks: Iterable[int]) -> None: ...

    def closed_at(self, local_rank: int) -> float | None: ...

    def has_parked(self, local_rank: int) -> bool: ...

    async def park(
        self,
        procs: Sequence[WorkerProcess],
        failed: Collection[int],
        fresh_store: bool,
        asked: Callable[[], Awaitable[None]] | None = None,
        where: Callable[[list[int]], Awaitable[dict[int, str]]] | None = None,
    ) -> dict[int, WorkerProcess]: ...

    def raised(self) -> dict[int, tuple[str, float]]: ...

    def forget(self, local_ranks: Iterable[int]) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class GpusPort(Protocol):
    """The bounded wait, from a stop to the next start, until the stopped workers' GPU
    memory is released or fits beside them."""

    def look(self) -> None: ...

    async def watched(self, pids: Iterable[int]) -> set[int]: ...

    def stopped(self, pids: set[int]) -> None: ...

    async def settled(self) -> None: ...


class NodeChecksPort(Protocol):
    """Health-gated membership: the gate before each join, the watch while workers run."""

    async def admit(self) -> None: ...

    def workers_started(self) -> None: ...

    async def workers_stopping(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class DrainPort(Protocol):
    """A coordinated drain, per attempt's control file."""

    def attempt(self, control_file: str) -> None: ...

    def workers_started(self) -> None: ...

    def request(self, reason: str, exit_code: int) -> bool: ...

    async def finished(self) -> None: ...

    def feed(self, messages: list[ProgressMessage]) -> None: ...

    def status(self) -> dict[str, Any] | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class SlowNodesPort(Protocol):
    """The job-wide straggler comparison, while the workers run."""

    def workers_started(self) -> None: ...

    async def workers_stopping(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class OomPort(Protocol):
    """Which worker deaths were the kernel's OOM killer."""

    def arm(self) -> None: ...

    def explain(self, pid: int, exitcode: int) -> dict[str, Any] | None: ...


__all__ = [
    "DrainPort",
    "GpusPort",
    "HealthPort",
    "HeartbeatsPort",
    "HygienePort",
    "InProcessPort",
    "NodeChecksPort",
    "OomPort",
    "PreloadPort",
    "ResultPort",
    "WatchdogPort",
    "WorkerStorePort",
]
