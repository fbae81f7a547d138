"""LocalElasticAgent: runs the worker group as local subprocesses of this agent.

The core is the worker lifecycle: plan each worker (its log routes, environment and
argv), spawn it, watch the group through exit events, and stop it with the one stop
policy. Everything else the agent does is a service (:mod:`agentd.view`), started in
order before the first rendezvous and stopped in reverse at the end: the run's record
(``result.json``), the event log, the watchdog, the health endpoint and process hygiene.
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

from agentd.agent.local_views import LocalAgentViews
from agentd.agent.template import SimpleElasticAgent
from agentd.assembly.services import AgentHooks, build_services
from agentd.assembly.settings import AgentSettings
from agentd.exceptions import AgentStopped, Drained, StartError
from agentd.group import RunResult, WorkerGroup, WorkerState
from agentd.hygiene import orphans
from agentd.inprocess.wire import DEFAULT_GRACE
from agentd.rendezvous.api import CoordinatesDrains, KeepsWorkers
from agentd.rendezvous.placement import agent_serves_store
from agentd.spec import LogsSpecs, WorkerSpec, check_log_prefix, check_name, check_start_method
from agentd.support import fdlimits
from agentd.support.aio import first_done
from agentd.support.sync_bridge import agent_step
from agentd.support.tempdirs import private_dir
from agentd.wire import control
from agentd.workers.output import attempt_dir, ensure_dir, prune_attempts
from agentd.workers.plan import plan_worker
from agentd.workers.processes import WorkerProcess, spawn_worker, stop_workers
from agentd.workers.release_gate import RELEASE_FDS_ENV, ReleaseGate

if TYPE_CHECKING:
    from agentd.assembly.ports import DrainPort, OomPort
    from agentd.assembly.services import ServicesFactory
    from agentd.view import Service
    from agentd.wire.progress import ProgressMessage

log = logging.getLogger(__name__)

_TAIL_WAIT = 0.5
_CAUSE_WAIT = 0.02


class LocalElasticAgent(LocalAgentViews, SimpleElasticAgent):
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
        *,
        log_dir: str | os.PathLike[str] | None = None,
        settings: AgentSettings | None = None,
        services: ServicesFactory | None = None,
    ) -> None:
        if isinstance(logs_specs, str):  # the documentation's LocalElasticAgent(spec, "spawn")
            logs_specs, start_method = None, logs_specs
        check_start_method(start_method)
        settings = settings or AgentSettings()
        if logs_specs is not None:
            log_dir = log_dir or logs_specs.root_log_dir
            spec.redirects, spec.tee = logs_specs.redirects, logs_specs.tee
            spec.local_ranks_filter = logs_specs.local_ranks_filter
        if log_line_prefix_template is not None:
            spec.log_line_prefix_template = check_log_prefix(log_line_prefix_template)
        super().__init__(spec, exit_barrier_timeout)
        self.start_method = start_method
        self.run_id = check_name("run_id", self.rdzv_handler.get_run_id())
        base = Path(log_dir) if log_dir else Path(private_dir("agentd_"))
        self.log_dir = base
        self.run_dir = base / self.run_id
        self.hostname = socket.gethostname()
        self.started_at = time.time()
        self.attempt = -1
        self._settings = settings._replace(fresh_run_id=settings.fresh_run_id or self.fresh_run_id)
        self._mark = orphans.owner_mark(self.run_id)
        self._procs: dict[int, WorkerProcess] = {}
        self._shut_down = False
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
        pipe_dir = self._services.watchdog.timer_server.private_dir
        if pipe_dir:  # a killed agent cannot remove it: its guardian will
            self._services.hygiene.remove_when_gone(pipe_dir)

    @agent_step
    async def _shutdown(
        self, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False
    ) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        group = self._worker_group
        try:
            if self._procs:
                await self._stop_workers(group)
                if group.state in (WorkerState.HEALTHY, WorkerState.UNHEALTHY):
                    self._set_state(WorkerState.STOPPED, "agent shutting down")
            await self.rdzv_handler.shutdown()
        finally:
            while self._running:
                service = self._running.pop()
                try:
                    await service.stop()
                except Exception:
                    log.exception("Could not stop %s", type(service).__name__)

    # -- the worker lifecycle ------------------------------------------------------------

    async def _before_join(self) -> None:
        if isinstance(self.rdzv_handler, KeepsWorkers):
            self.rdzv_handler.announce_kept(self._services.inprocess.keeping())
        if self._exit_on_leave is not None:  # drained: this node is done
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

    def request_drain(self, reason: str, signum: int | None = None) -> None:
        """Drain this node: every rank checkpoints at one step, then the job goes on
        without it, and it exits 0 (128+``signum`` for a signal). A second request, or one
        without running workers, stops at once."""
        drain = self._drain
        exit_code = 128 + signum if signum is not None else 0
        if drain is None or not self._procs or not drain.request(reason, exit_code):
            self.request_stop(signum or signal.SIGTERM)

    def _on_progress(self, messages: list[ProgressMessage]) -> None:
        self._services.heartbeats.feed(messages)
        if self._drain is not None:
            self._drain.feed(messages)

    @agent_step
    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        group = worker_group
        self.attempt += 1
        prune_attempts(self.run_dir, self.attempt, self._settings.keep_attempts)
        await self._services.workers_store.open_for(group)
        spec = group.spec
        if isinstance(self.rdzv_handler, CoordinatesDrains):
            self.control_file = str(self.run_dir / "drain.control")
            control.create(self.control_file)
        dropped = self._services.inprocess.unresumable()  # kept, but their channel closed since
        if dropped:
            await self._stop_dropped(dropped)
        plans = [plan_worker(self, group, worker) for worker in group.workers]
        if isinstance(spec.entrypoint, str):
            handler, grace = self.rdzv_handler, DEFAULT_GRACE
            if (group.group_world_size or 1) > 1 and isinstance(handler, KeepsWorkers):
                grace += handler.peer_loss_timeout()  # a lost node takes that long to see
            self._services.inprocess.plan(
                plans, self.kept_ranks, grace
            )  # drops kept ones that died
        else:  # function workers leave together
            self._gate = ReleaseGate(len(plans))
            for _, _, env, *_, pass_fds in plans:
                env[RELEASE_FDS_ENV] = self._gate.env_value
                pass_fds.extend(self._gate.worker_fds)
        kept = self._services.inprocess.parked
        spawn = self._services.preload.spawn if self._services.preload.enabled else spawn_worker
        with self._services.hygiene.spawning():
            procs = await asyncio.gather(
                *(spawn(w.local_rank, *plan) for w, *plan in plans if w.local_rank not in kept),
                return_exceptions=True,
            )
            started = [p for p in procs if isinstance(p, WorkerProcess)]
            self._services.inprocess.spawned(p.local_rank for p in started)
            await self._services.hygiene.started(started)
        started += self._services.inprocess.resume_all(plans)
        if self._oom is None:
            from agentd.assembly.services import oom_watch

            self._oom = oom_watch()
        self._oom.arm()  # after the spawns: the first worker need not wait for it
        if self.attempt == 0:
            self._after_first_start()
        if self._gate is not None:
            self._gate.spawned()
        self._services.heartbeats.started(group, started)
        if self._services.node_checks is not None:
            self._services.node_checks.workers_started()
        self._start_drains()
        errors = [p for p in procs if isinstance(p, BaseException)]
        self._procs = {p.local_rank: p for p in started}
        for proc in started:
            proc.exited.add_done_callback(lambda _f: self._wakeup.set())
        if errors:
            await self._stop_workers(group)
            raise errors[0]
        log.info(
            "[%s] Started %d worker(s), attempt %d, pids %s, logs in %s",
            spec.role,
            len(started),
            self.attempt,
            [p.pid for p in started],
            self.run_dir / f"attempt_{self.attempt}",
        )
        return {p.local_rank: p.pid for p in started}

    async def _stop_dropped(self, procs: list[WorkerProcess]) -> None:
        """Stop kept workers that can no longer be resumed; their ranks start anew."""
        pids = await self._services.gpus.watched(p.pid for p in procs)
        spared = {p.pgid for p in self._services.inprocess.parked.values()}  # kept: not strays
        signum = self._worker_group.spec.stop_signal
        await stop_workers(procs, signum, self._stop_timeout(), self._force, self._mark, spared)
        self._services.hygiene.stopped(procs)
        self._services.watchdog.forget(p.pid for p in procs)
        self._services.inprocess.forget(p.local_rank for p in procs)
        await self._services.gpus.wait(pids)

    def _after_first_start(self) -> None:
        """Once the first workers are spawned: sweep dead agents' pipe directories, and load
        what a failure needs, so neither the launch nor the first restart waits for it."""
        self._services.watchdog.sweep_stale_pipes()
        self._services.gpus.look()
        import agentd.errors.error_file
        import agentd.telemetry.metrics_api  # noqa: F401

    async def _restart_after(self, group: WorkerGroup, reason: str) -> None:
        with self._services.inprocess.restarting():
            await super()._restart_after(group, reason)

    async def _restart_group(self, group: WorkerGroup, reason: str, stopped: bool = False) -> None:
        with self._services.inprocess.restarting():
            await super()._restart_group(group, reason, stopped)

    def _start_drains(self) -> None:
        handler = self.rdzv_handler
        if self.control_file is None or not isinstance(handler, CoordinatesDrains):
            return
        if self._drain is None:
            from agentd.assembly.services import drain_service

            self._drain = drain_service(self._settings.drain, handler.drains, self._hooks)
            self._running.append(self._drain)  # stopped with the other services
        self._drain.attempt(self.control_file)
        self._drain.workers_started()

    @agent_step
    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        await self._wakeup.wait()
        self._wakeup.clear()
        return await self._check_workers(worker_group)

    async def _check_workers(self, group: WorkerGroup) -> RunResult:
        procs = self._procs
        self._services.watchdog.forget(p.pid for p in procs.values() if p.returncode is not None)
        if self._services.watchdog.unhealthy:
            return self._unhealthy_result(group)
        failed = [p for p in procs.values() if p.returncode not in (None, 0)]
        if (
            not failed and self._services.inprocess.raised()
        ):  # the cause may be a peer's exit: see it
            await self._services.inprocess.see_exits(procs.values(), _CAUSE_WAIT)
            failed = [p for p in procs.values() if p.returncode not in (None, 0)]
        raised = {r: e for r, e in self._services.inprocess.raised().items() if r in procs}
        if failed or raised:
            if failed:
                await asyncio.wait([p.pipes_closed for p in failed], timeout=_TAIL_WAIT)
            failures = self._failures(group, failed, raised)
            self._failed_ranks = {p.local_rank for p in failed}
            return RunResult(WorkerState.FAILED, failures=failures)
        if procs and all(p.returncode == 0 for p in procs.values()):
            values: dict[int, Any] = {}
            if not isinstance(group.spec.entrypoint, str):
                from agentd.workers.function import read_result

                for worker in group.workers:
                    wdir = attempt_dir(self.run_dir, self.attempt, worker.local_rank)
                    values[worker.global_rank] = read_result(wdir / "return.pickle")
            return RunResult(WorkerState.SUCCEEDED, return_values=values)
        return RunResult(WorkerState.HEALTHY)

    @agent_step
    async def _stop_workers(self, worker_group: WorkerGroup) -> None:
        group = worker_group
        procs = list(self._procs.values())
        if not procs:
            return
        spec = group.spec
        fresh_store = agent_serves_store(self.rdzv_handler, group)
        kept = await self._services.inprocess.park(procs, self._failed_ranks, fresh_store)
        self._failed_ranks = set()  # the next stop may be a membership change: none failed
        procs = [p for p in procs if p.local_rank not in kept]
        running = sum(p.returncode is None for p in procs)
        level = logging.INFO if running else logging.DEBUG
        log.log(
            level,
            "[%s] Stopping %d running worker(s) with %s",
            spec.role,
            running,
            spec.stop_signal.name,
        )
        await self._services.heartbeats.stopped()
        if self._services.node_checks is not None:
            await self._services.node_checks.workers_stopping()
        strays: list[int] = []
        gpu_pids = await self._services.gpus.watched(p.pid for p in procs)
        try:
            strays = await stop_workers(
                procs,
                spec.stop_signal,
                self._stop_timeout(),
                self._force,
                self._mark,
                spare_groups={p.pgid for p in kept.values()},
            )
        finally:
            if strays:
                log.warning(
                    "[%s] Killed %d process(es) that left their worker's group: %s",
                    spec.role,
                    len(strays),
                    strays,
                )
            self._services.hygiene.stopped(procs)
            for worker in group.workers:
                worker.id = None
            self._services.watchdog.forget(p.pid for p in procs)
            self._services.watchdog.clear()
            self._procs = dict(kept)
            self._services.inprocess.forget(p.local_rank for p in procs)
            if self._gate is not None:
                self._gate.close()
                self._gate = None
            log.log(level, "[%s] Stopped worker group", spec.role)
        await self._services.gpus.wait(gpu_pids | set(strays))
