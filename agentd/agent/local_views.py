"""The local agent's read-only views: what its services, the health endpoint and the
Python API read of it (the :class:`~agentd.view.AgentView` protocol)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentd.group import RunResult, Worker, WorkerFailure, WorkerGroup, WorkerState
from agentd.workers.output import attempt_dir

if TYPE_CHECKING:
    from pathlib import Path

    from agentd.assembly.ports import DrainPort, OomPort, SlowNodesPort
    from agentd.assembly.services import LocalServices
    from agentd.health.metrics import AgentMetrics
    from agentd.health.server import Check, HealthCheckServer
    from agentd.heartbeats.stragglers import StepTimes
    from agentd.rendezvous.api import RendezvousHandler
    from agentd.timer.server import TimerServer
    from agentd.workers.processes import WorkerProcess


class LocalAgentViews:
    """Mixed into :class:`~agentd.agent.local.LocalElasticAgent`, whose state it reads."""

    _mark: str
    _services: LocalServices
    _procs: dict[int, WorkerProcess]
    _failed_ranks: set[int]
    _drain: DrainPort | None
    _slow_nodes: SlowNodesPort | None
    _oom: OomPort | None
    run_dir: Path
    attempt: int
    hostname: str
    rdzv_handler: RendezvousHandler
    error_files: dict[int, str]

    @property
    def restart_kinds(self) -> dict[str, int]:
        """Restarts so far by kind: ``in_process`` (the survivors kept their process) and
        ``process`` (an in-process restart fell back to new processes for every rank)."""
        return dict(self._services.inprocess.kinds)

    def inprocess_status(self) -> dict[str, Any]:
        """Restarts that did not keep every surviving rank: counts by reason
        (``fallbacks``) and the last one (``last_fallback``: its reason, the local ranks it
        concerned and those kept anyway; None before any)."""
        last = self._services.inprocess.last_fallback
        return {
            "fallbacks": dict(self._services.inprocess.fallbacks),
            "last_fallback": None if last is None else last._asdict(),
        }

    @property
    def owner_mark(self) -> str:
        """The mark in every worker's environment that names this agent's run."""
        return self._mark

    @property
    def timer_file(self) -> str | None:
        """The named pipe workers write timer requests to (None without the file timer)."""
        return self._services.watchdog.timer_file

    @property
    def timer_server(self) -> TimerServer:
        return self._services.watchdog.timer_server

    @property
    def progress_pipe(self) -> str | None:
        """The named pipe workers send heartbeats on (once the agent started)."""
        return self._services.watchdog.progress_pipe

    def heartbeat_status(self) -> dict[str, Any]:
        """Hang detection's view: timeouts, each worker's progress, hangs and stragglers."""
        return self._services.heartbeats.status()

    @property
    def step_times(self) -> StepTimes:
        return self._services.heartbeats.step_times

    @property
    def health_server(self) -> HealthCheckServer | None:
        return self._services.health.server if self._services.health is not None else None

    @property
    def metrics(self) -> AgentMetrics | None:
        return self._services.health.metrics if self._services.health is not None else None

    @property
    def result_file(self) -> Any:
        return self._services.result.file

    @property
    def result_written(self) -> bool:
        return self._services.result.written

    def worker_processes(self) -> Mapping[int, WorkerProcess]:
        """The current attempt's worker processes, by local rank."""
        return self._procs

    def slow_node_status(self) -> dict[str, Any] | None:
        """The job-wide straggler comparison's last verdict (None: not running)."""
        return self._slow_nodes.status() if self._slow_nodes is not None else None

    def drain_status(self) -> dict[str, Any] | None:
        """The last drain this agent followed (None: none yet)."""
        return self._drain.status() if self._drain is not None else None

    def _peer_drain_under_way(self) -> str:
        """The node whose drain this agent follows since its workers started ('': none,
        or the drain is this node's own)."""
        status = self.drain_status()
        if not status or not self._procs:
            return ""
        started = min(proc.started_at for proc in self._procs.values())
        node = str(status.get("node") or "")
        if node == getattr(self.rdzv_handler, "node_id", None):
            return ""
        return node if float(status.get("requested_at") or 0.0) >= started else ""

    def node_check_status(self) -> dict[str, Any] | None:
        """The node checks' last results and exclusions (None without ``--node-check``)."""
        return (
            self._services.node_checks.status() if self._services.node_checks is not None else None
        )

    def preload_status(self) -> dict[str, Any] | None:
        """The zygote of ``--preload`` (None when workers are spawned)."""
        return self._services.preload.status()

    def liveness_checks(self) -> list[Check]:
        """What ``/livez`` reports: the watchdog is alive and the loop keeps time."""
        if self._services.health is not None:
            return self._services.health.liveness_checks()
        from agentd.health.server import Check

        alive = self.timer_server.alive()
        return [Check("watchdog", alive, f"{len(self.timer_server)} timer(s)")]

    def failure_report(self) -> str:
        """The text report of the last run's failure (empty when it did not fail)."""
        return self._services.result.failure_report()

    def worker_process_of(self, pid: int) -> WorkerProcess | None:
        """The worker whose tree ``pid`` is in (by pid, then by process group)."""
        for proc in self._procs.values():
            if proc.pid == pid:
                return proc
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(pid)
            return next((p for p in self._procs.values() if p.pgid == pgid), None)
        return None

    def _failure(self, group: WorkerGroup, worker: Worker, proc: WorkerProcess) -> WorkerFailure:
        error_file = self.error_files.get(worker.local_rank) or (
            attempt_dir(self.run_dir, self.attempt, worker.local_rank) / "error.json"
        )
        failure = WorkerFailure(
            local_rank=worker.local_rank,
            pid=proc.pid,
            exitcode=proc.returncode if proc.returncode is not None else -1,
            error_file=str(error_file),
            global_rank=worker.global_rank,
            role=group.spec.role,
            timestamp=min(
                t
                for t in (
                    proc.exited_at,
                    self._services.inprocess.closed_at(worker.local_rank),
                    time.time(),
                )
                if t is not None
            ),
            stderr_tail=proc.stderr.tail() if proc.stderr is not None else "",
            host=self.hostname,
            node_rank=group.group_rank or 0,
        )
        oom = self._oom.explain(proc.pid, failure.exitcode) if self._oom is not None else None
        if oom is not None:
            from agentd.reports.oom import describe

            failure.oom = oom
            failure.message = failure.message or describe(oom)
        return failure

    def _failures(
        self, group: WorkerGroup, exited: list[WorkerProcess], raised: dict[int, tuple[str, float]]
    ) -> dict[int, WorkerFailure]:
        """By global rank: the workers that exited failing, and those whose training function
        raised (alive, and kept if an in-process restart can keep them)."""
        by_rank = {w.local_rank: w for w in group.workers}
        failures = {
            by_rank[p.local_rank].global_rank: self._failure(group, by_rank[p.local_rank], p)
            for p in exited
        }
        for rank, (message, at) in raised.items():
            failures[by_rank[rank].global_rank] = dataclasses.replace(
                self._failure(group, by_rank[rank], self._procs[rank]),
                exitcode=1,
                message=message,
                timestamp=at,
            )
        return failures

    def _unhealthy_result(self, group: WorkerGroup) -> RunResult:
        """The group's result when the watchdog reaped or found hung workers."""
        by_rank = {w.local_rank: w for w in group.workers}
        failures: dict[int, WorkerFailure] = {}
        for found in self._services.watchdog.unhealthy:
            proc = self.worker_process_of(found.pid)
            if proc is None:
                continue
            worker = by_rank[proc.local_rank]
            failures[worker.global_rank] = dataclasses.replace(
                self._failure(group, worker, proc),
                exitcode=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
                message=found.why,
                timestamp=found.when,
                hang=found.details,
            )
        self._failed_ranks = {f.local_rank for f in failures.values()}
        return RunResult(WorkerState.UNHEALTHY, failures=failures)
