"""LocalElasticAgent: runs the worker group as local subprocesses of this agent.

The worker lifecycle (plan, spawn, watch, stop) is :mod:`agentd.agent.lifecycle`; here
the agent is put together: its services, built by :mod:`agentd.assembly` from one
settings record, started in order before the first rendezvous and stopped in reverse
at the end, and how it leaves the job (a drain, failed node checks).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.agent.lifecycle import WorkerLifecycle
from agentd.agent.rendezvous_steps import fixed_size
from agentd.assembly.services import AgentHooks, build_services
from agentd.assembly.settings import AgentSettings
from agentd.exceptions import DRAINED_UNFINISHED, AgentStopped, Drained, StartError
from agentd.group import WorkerGroup, WorkerState
from agentd.hygiene import orphans
from agentd.rendezvous.api import Hurries, KeepsWorkers, LeavesSoon
from agentd.spec import WorkerSpec, check_log_prefix, check_name, check_start_method
from agentd.support import fdlimits
from agentd.support.aio import first_done
from agentd.support.sync_bridge import agent_step
from agentd.support.tempdirs import private_dir
from agentd.workers.output import drop_staged_attempt, ensure_dir
from agentd.workers.processes import WorkerProcess

if TYPE_CHECKING:
    from agentd.assembly.ports import DrainPort, OomPort, SlowNodesPort
    from agentd.assembly.services import ServicesFactory
    from agentd.assembly.torch_env import Stoppable
    from agentd.view import Service
    from agentd.wire.progress import ProgressMessage
    from agentd.workers.logs_specs import LogsSpecs
    from agentd.workers.release_gate import ReleaseGate

log = logging.getLogger(__name__)


class LocalElasticAgent(WorkerLifecycle):
    """Runs ``spec.local_world_size`` workers as subprocesses and supervises them.

    ``log_dir`` holds ``<run_id>/attempt_<n>/<local_rank>/`` per worker and the run's
    ``result.json``; without one, a fresh temporary directory is used. ``settings``
    (:class:`~agentd.assembly.settings.AgentSettings`) say what runs beside the workers:
    process hygiene, the watchdog, hang detection, the health endpoint, the event log,
    node checks, drains, in-process restarts; ``services`` builds them
    (:func:`~agentd.assembly.services.build_services` by default) and the agent knows
    each only by what it calls on it (:mod:`agentd.assembly.ports`).

    A worker reaped by the watchdog, or a group whose heartbeats stopped, makes the
    group UNHEALTHY, which restarts it per policy like a failure.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs | None = None,
        start_method: str = "spawn",
        exit_barrier_timeout: float = 300.0,
        log_line_prefix_template: str | None = None,
        shutdown_timeout: float | None = None,
        health_check_server: Stoppable | None = None,
        uninterruptible_state_timeout: float | None = None,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        settings: AgentSettings | None = None,
        services: ServicesFactory | None = None,
    ) -> None:
        if isinstance(logs_specs, str):  # the documentation's LocalElasticAgent(spec, "spawn")
            logs_specs, start_method = None, logs_specs
        check_start_method(start_method)
        settings = settings or AgentSettings()
        if health_check_server is not None or uninterruptible_state_timeout is not None:
            from agentd.assembly.torch_env import with_torch_arguments

            settings = with_torch_arguments(
                settings, health_check_server, uninterruptible_state_timeout
            )
        self._health_check_server = health_check_server
        self.logs_specs = logs_specs
        self.error_files: dict[int, str] = {}
        if logs_specs is not None:
            log_dir = log_dir or logs_specs.root_log_dir
            from agentd.workers.logs_specs import output_settings

            spec.redirects, spec.tee, spec.local_ranks_filter = output_settings(logs_specs)
        if log_line_prefix_template is not None:
            spec.log_line_prefix_template = check_log_prefix(log_line_prefix_template)
        super().__init__(spec, exit_barrier_timeout, shutdown_timeout)
        self.start_method = start_method
        self._drain_after_done = False
        self.run_id = check_name("run_id", self.rdzv_handler.get_run_id())
        self.hostname = socket.gethostname()
        folder = settings.run_folder or self.run_id
        if log_dir:  # maybe shared with other hosts: the run's folder is claimed
            from agentd.workers.run_folder import claim_run_dir

            self.log_dir = Path(log_dir)
            self.run_dir = claim_run_dir(self.log_dir, folder, self.hostname)
        else:
            self.log_dir = Path(private_dir("agentd_"))
            self.run_dir = self.log_dir / folder
        self.started_at = time.time()
        self.attempt = -1
        self._settings = settings.replace(fresh_run_id=settings.fresh_run_id or self.fresh_run_id)
        self._mark = orphans.owner_mark(self.run_id)
        self._procs: dict[int, WorkerProcess] = {}
        self.run_over = False  # its shutdown began (the AgentView's)
        self._hooks = AgentHooks(
            self,
            lambda: self._procs,
            self._wakeup.set,
            self._notify,
            self._leave,
            self.add_observer,
        )
        self._services = (services or build_services)(self._hooks, self._settings)
        self._services.watchdog.on_progress(self._on_progress)
        self._gate: ReleaseGate | None = None
        self._failed_ranks: set[int] = set()
        self._oom: OomPort | None = None
        self._drain: DrainPort | None = None
        self._drain_attempt = -1
        self._slow_nodes: SlowNodesPort | None = None
        self._exit_on_leave: int | None = None
        self.control_file: str | None = None
        """The drain's control file of the current attempt (see :mod:`agentd.drain`)."""
        self._running: list[Service] = []

    # -- the views that need the whole agent (the others: LocalAgentViews) --------------

    def worker_readings(self) -> list[dict[str, Any]]:
        from agentd.health.service import worker_readings

        return worker_readings(self)

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows (no environment, no output, no tracebacks)."""
        from agentd.health.service import status_document

        return status_document(self)

    # -- start and shutdown --------------------------------------------------------------

    async def _startup(self) -> None:
        """Once per agent: the log dir, the descriptor limit, then the services."""
        try:
            ensure_dir(self.run_dir)
        except OSError as exc:
            raise StartError(f"log_dir: cannot create {self.run_dir}: {exc.strerror}") from exc
        fdlimits.raise_open_files_limit()
        for service in self._services.in_order():
            await service.start()
            self._running.append(service)
        pipe_dir = self._services.watchdog.pipe_dir
        if pipe_dir:  # a killed agent cannot remove it: its guardian will
            self._services.hygiene.remove_when_gone(pipe_dir)

    @agent_step
    async def _shutdown(
        self, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False
    ) -> None:
        if self.run_over:
            return
        self.run_over = True
        group = self._worker_group
        handler = self.rdzv_handler
        hurried = None  # a second stop request cuts a wait of the leave for the peers
        if isinstance(handler, Hurries):
            hurry = handler.hurry
            hurried = asyncio.ensure_future(self._force.wait())
            hurried.add_done_callback(lambda task: None if task.cancelled() else hurry())
        try:
            if self._stop_signal is not None and isinstance(handler, LeavesSoon):
                await handler.leaving_soon()  # before the workers: they take a while
            if self._procs:
                await self._stop_workers(group)
                if group.state in (WorkerState.HEALTHY, WorkerState.UNHEALTHY):
                    self._set_state(WorkerState.STOPPED, "agent shutting down")
            await handler.shutdown()
            await self._services.gpus.settled()  # the agent ends once its GPUs are free
        finally:
            if hurried is not None:
                hurried.cancel()
            drop_staged_attempt(self.run_dir)
            while self._running:
                service = self._running.pop()
                try:
                    await service.stop()
                except Exception:
                    log.exception("Could not stop %s", type(service).__name__)
            if self._health_check_server is not None:  # the caller's: torch's agent stops it
                await asyncio.to_thread(self._health_check_server.stop)

    # -- joining, leaving, restarting (the lifecycle itself: agent/lifecycle.py) ------

    async def _before_join(self) -> None:
        if isinstance(self.rdzv_handler, KeepsWorkers):
            self.rdzv_handler.announce_kept(self._services.inprocess.keeping())
        if self._drain is not None and self._exit_on_leave is None:
            # The round ended during this node's own drain (a node draining with it left
            # first): it leaves once its drain is done, rather than join the next round.
            await first_done(self._drain.finished(), self._stop_requested.wait())
            self._raise_if_stop_requested()
        if self._exit_on_leave is not None:  # drained: this node is done
            if self._stepping_out is not None:  # the round ended first: no step out said so
                role = self._worker_group.spec.role
                log.warning("[%s] This node %s; leaving the job", role, self._stepping_out)
            code = self._exit_on_leave
            raise AgentStopped(code - 128) if code > 128 else Drained(code)
        if self._services.node_checks is not None:
            admit, _ = await first_done(
                self._services.node_checks.admit(), self._stop_requested.wait()
            )
            self._raise_if_stop_requested()
            admit.result()  # NodeUnfit: this host gives up

    def _leave(self, why: str, exit_code: int | None = None, alone: bool = False) -> None:
        """Leave the job (its round ends; no restart spent); with ``exit_code``, for good;
        ``alone``: no other node runs the job, so it ends here."""
        self._stepping_out, self._exit_on_leave, self._leaving_alone = why, exit_code, alone
        self._wakeup.set()

    def request_drain(self, reason: str, signum: int | None = None, replaced: bool = False) -> None:
        """Drain this node: every rank checkpoints at one step, then the job goes on
        without it, and it exits 0 (128+``signum`` for a signal). A job that runs only at
        its size (static, ``--nnodes N``) cannot go on without it unless a spare takes its
        place (``replaced``, the straggler swap): it exits :data:`DRAINED_UNFINISHED`,
        since its peers wait for a node in its place, and a scheduler starts one only for
        a node that did not succeed. A second request, or one without running workers,
        stops at once. Workers that succeeded leave nothing to save and no rank to
        replace: the first request asks no node to checkpoint, and the agent leaves at
        the end of its exit barrier (its peers may need its store)."""
        done = self._worker_group.state is WorkerState.SUCCEEDED
        if done and not self._drain_after_done:
            self._drain_after_done = True
            log.info(
                "Drain (%s): this node's workers have succeeded; no node is asked to "
                "checkpoint, and this one leaves at the end of its exit barrier (again "
                "to stop now)",
                reason,
            )
            return
        drain = self._drain_now() if self._procs and not done else None
        exit_code = 128 + signum if signum is not None else 0
        if exit_code == 0 and not replaced and fixed_size(self.rdzv_handler):
            exit_code = DRAINED_UNFINISHED
        if drain is None or not self._procs or not drain.request(reason, exit_code):
            self.request_stop(signum or signal.SIGTERM)

    def _on_progress(self, messages: list[ProgressMessage]) -> None:
        self._services.heartbeats.feed(messages)
        if self._drain is not None:
            self._drain.feed(messages)

    async def _restart_after(self, group: WorkerGroup, reason: str) -> None:
        with self._services.inprocess.restarting():
            await super()._restart_after(group, reason)

    async def _restart_group(self, group: WorkerGroup, reason: str, stopped: bool = False) -> None:
        with self._services.inprocess.restarting():
            await super()._restart_group(group, reason, stopped)
