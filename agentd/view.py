"""How the agent's core and its services see each other: small protocols, and the
observer hooks the agent calls as things happen (metrics and events use them).

The core (:mod:`agentd.agent.local`) starts its services in order and stops them in reverse,
whatever happened; it knows each only as a :class:`Service`. A service sees the agent only
as an :class:`AgentView`: read-only facts about the run and lookups of its workers, never
the agent's internals. So a feature (health, heartbeats, reports, the workers' store, ...)
depends on this module and the spec, never on the local agent, and the agent can be
replaced by anything that offers the same view (tests do).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agentd.group import RunResult, WorkerFailure, WorkerGroup, WorkerState
    from agentd.heartbeats.stragglers import StepTimes, Straggler
    from agentd.rendezvous.api import RendezvousHandler
    from agentd.timer.server import TimerServer
    from agentd.workers.logs_specs import LogsSpecs
    from agentd.workers.processes import WorkerProcess


class Helpers(Protocol):
    """The agent's process hygiene, for a service that spawns a helper process: the agent
    reaps orphans, so a helper's exit status must be left to the service that waits for it
    (spawn inside :meth:`spawning`, :meth:`own` the pid, :meth:`disown` it once reaped:
    :func:`agentd.support.owned.owned` does all three)."""

    def spawning(self) -> AbstractContextManager[None]: ...

    def own(self, pid: int | None) -> None: ...

    def disown(self, pid: int | None) -> None: ...


class Service(Protocol):
    """Something the agent runs beside its workers, from start to shutdown."""

    async def start(self) -> None:
        """Start; raising StartError stops the agent before any worker runs."""
        ...

    async def stop(self) -> None:
        """Stop and release everything; never raises (it runs on every way out)."""
        ...


class AgentView(Protocol):
    """What a service may know of the local agent (all read-only)."""

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path:
        """``<log_dir>/<run_id>`` (see :mod:`agentd.workers.run_folder` for the others):
        every attempt's files and the run's own."""
        ...

    @property
    def hostname(self) -> str: ...

    @property
    def started_at(self) -> float:
        """When the agent started (epoch seconds)."""
        ...

    @property
    def attempt(self) -> int:
        """The current attempt (-1 before the first)."""
        ...

    @property
    def generation(self) -> int:
        """The rendezvous round the workers belong to (-1 before the first)."""
        ...

    @property
    def restart_count(self) -> int: ...

    @property
    def remaining_restarts(self) -> int: ...

    @property
    def owner_mark(self) -> str:
        """The mark in every worker's environment that names this agent's run."""
        ...

    @property
    def rdzv_handler(self) -> RendezvousHandler: ...

    @property
    def last_result(self) -> RunResult | None: ...

    @property
    def last_failure(self) -> WorkerFailure | None: ...

    @property
    def lost_peer(self) -> dict[str, Any] | None:
        """The peer whose loss failed this node's workers (see agent/rendezvous_steps.py)."""
        ...

    @property
    def exit_error(self) -> BaseException | None:
        """Why the run ended, when it ended with an error."""
        ...

    @property
    def run_over(self) -> bool:
        """The run has ended: the agent releases what it holds (the group's state is
        final; the rendezvous and its store may be gone)."""
        ...

    @property
    def timer_server(self) -> TimerServer: ...

    @property
    def timer_file(self) -> str | None: ...

    @property
    def progress_pipe(self) -> str | None: ...

    control_file: str | None
    """The drain's control file of the current attempt (None: no drains)."""

    logs_specs: LogsSpecs | None
    """The log specs the agent was given (None: agentd's layout); one whose ``reify`` is
    its own decides where the workers' output and error files go."""

    @property
    def step_times(self) -> StepTimes: ...

    def get_worker_group(self) -> WorkerGroup: ...

    def worker_processes(self) -> Mapping[int, WorkerProcess]:
        """The current attempt's worker processes, by local rank."""
        ...

    def worker_process_of(self, pid: int) -> WorkerProcess | None:
        """The worker whose process tree ``pid`` belongs to."""
        ...

    def heartbeat_status(self) -> dict[str, Any]: ...

    def node_check_status(self) -> dict[str, Any] | None: ...

    def drain_status(self) -> dict[str, Any] | None: ...

    def slow_node_status(self) -> dict[str, Any] | None: ...

    def preload_status(self) -> dict[str, Any] | None: ...

    @property
    def restart_kinds(self) -> dict[str, int]:
        """Restarts by kind: ``in_process`` (survivors kept) or ``process`` (a fallback)."""
        ...

    def inprocess_status(self) -> dict[str, Any]:
        """In-process restarts' fallbacks: counts by reason and the last one."""
        ...

    def worker_readings(self) -> list[dict[str, Any]]: ...

    def add_observer(self, observer: AgentObserver) -> None: ...

    def request_drain(
        self, reason: str, signum: int | None = None, replaced: bool = False
    ) -> None: ...


PHASES = ("detect", "stop", "rendezvous", "start")
"""The phases of a recovery, in order: see a failure, stop the group, rendezvous, start."""


class AgentObserver:
    """Subclass and override what you need; every hook here does nothing.

    Hooks run on the agent's event loop and must not block; an exception in one is logged
    and does not disturb the agent.
    """

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        """The worker group moved from ``old`` to ``new``."""

    def phase_timed(self, phase: str, seconds: float) -> None:
        """One of :data:`PHASES` took ``seconds``."""

    def restarted(self, reason: str, restart_count: int) -> None:
        """The group is being restarted (``failure``, ``unhealthy`` or ``membership``)."""

    def worker_failed(self, failure: WorkerFailure) -> None:
        """A worker failed (once per failure, root cause first)."""

    def hang_detected(self, details: dict[str, Any]) -> None:
        """The workers stopped heartbeating; ``details`` name who stopped first, where each
        rank was and where the stack dumps are (as in ``result.json``'s ``hang``)."""

    def straggler(self, straggler: Straggler) -> None:
        """A rank has been slower than the others' median for a while (reported once)."""

    def slow_node(self, details: dict[str, Any]) -> None:
        """A node of the job has been slower than the other nodes for a while (named once,
        on every agent; ``details``: node, ratio, the job's median per section)."""

    def node_excluded(self, details: dict[str, Any]) -> None:
        """This host failed its node checks and stays out of the job for a cooldown
        (``details``: reason, checks, exclusions, cooldown, until)."""

    def node_readmitted(self) -> None:
        """This host's node checks pass again: it joins the job."""

    def drain_requested(self, details: dict[str, Any]) -> None:
        """A drain began (``details``: id, node, reason, requested_at): checkpointing."""

    def drain_done(self, outcome: dict[str, Any]) -> None:
        """This node's drain is over (``outcome``: step, nodes, acknowledged, missing,
        seconds, alone, leaving, store_lost); it leaves the job."""
