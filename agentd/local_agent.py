"""LocalElasticAgent: runs the worker group as local subprocesses of this agent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from agentd import fdlimits, orphans
from agentd.agent import SimpleElasticAgent
from agentd.events import AgentEvents, Event, JsonLinesFile
from agentd.exceptions import StartError
from agentd.guardian import Guardian
from agentd.logs import attempt_dir, disk_problem, ensure_dir, plan_route, prune_attempts
from agentd.results import ResultFile, outcome
from agentd.spec import (
    RunResult,
    Std,
    Worker,
    WorkerFailure,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
    check_name,
    std_for,
)
from agentd.timer.api import TimerRequest
from agentd.timer.hang import UninterruptibleMonitor
from agentd.timer.server import FileTimerServer, TimerServer, WatchdogSettings, signal_name
from agentd.worker_env import WorkerEnvContext, worker_env
from agentd.workers import WorkerProcess, spawn_worker, stop_workers

if TYPE_CHECKING:
    from agentd.health import Check, HealthCheckServer, HealthSettings, LoopLagMonitor
    from agentd.metrics import AgentMetrics

log = logging.getLogger(__name__)


def _debug_event(event: Event) -> None:
    log.debug("event %s", event.to_json())


_TAIL_WAIT = 0.5


class LocalElasticAgent(SimpleElasticAgent):
    """Runs ``spec.local_world_size`` workers as subprocesses and supervises them.

    ``log_dir`` holds ``<run_id>/attempt_<n>/<local_rank>/`` per worker and the run's
    ``result.json``; without one, a fresh temporary directory is used. The first attempt's
    directory and the last ``keep_attempts`` are kept (0: all). With
    ``process_hygiene`` (the default) the agent becomes a child subreaper, reaps orphans,
    runs a guardian that kills the workers if the agent is killed, and kills workers left
    over by a dead agent of the same run id (``fresh_run_id`` says the id was just
    generated, so there can be none and the look for them is skipped).

    The watchdog (:attr:`timer_server`) runs with the agent; ``watchdog`` settings add
    torch's named-pipe timers and D-state detection. A worker reaped by it makes the
    group UNHEALTHY, which restarts it per policy like a failure.

    ``health`` serves ``/livez``, ``/readyz``, ``/status`` and ``/metrics`` from before the
    first rendezvous to the end; ``event_log`` appends the run's events as JSON lines.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        log_dir: str | os.PathLike[str] | None = None,
        exit_barrier_timeout: float = 300.0,
        process_hygiene: bool = True,
        fresh_run_id: bool = False,
        watchdog: WatchdogSettings | None = None,
        health: HealthSettings | None = None,
        event_log: str | None = None,
        keep_attempts: int = 10,
    ) -> None:
        super().__init__(spec, exit_barrier_timeout)
        self.run_id = check_name("run_id", self.rdzv_handler.get_run_id())
        if log_dir:
            base = Path(log_dir)
        else:
            import tempfile  # only for the default: it is slow to import

            base = Path(tempfile.mkdtemp(prefix="agentd_"))
        self.log_dir = base
        self._fresh_run_id = fresh_run_id
        self.run_dir = base / self.run_id
        self.result_file = ResultFile(self.run_dir / "result.json")
        self._keep_attempts = keep_attempts
        self.result_written = False
        self.hostname = socket.gethostname()
        self.attempt = -1
        self._hygiene = process_hygiene
        self._mark = orphans.owner_mark(self.run_id)
        self._reaper = orphans.ZombieReaper()
        self._guardian: Guardian | None = None
        self._procs: dict[int, WorkerProcess] = {}
        self._sigchld_installed = False
        self._shut_down = False
        self._watchdog = watchdog or WatchdogSettings()
        self._health_settings = health
        self._event_log = event_log
        self.timer_server = self._make_timer_server()
        if health is not None:
            self.timer_server.max_overdue = health.timeout
        self.health_server: HealthCheckServer | None = None
        self.metrics: AgentMetrics | None = None
        self._lag: LoopLagMonitor | None = None
        self._event_file: JsonLinesFile | None = None
        self._started_at = time.time()
        self._hang_monitor: UninterruptibleMonitor | None = None
        self._fd_limit = 1024
        self._unhealthy: list[tuple[int, str, float]] = []
        """(pid, why, when) of workers the watchdog reaped since the group started."""
        self._lease: float | None = None
        on_lease = getattr(self.rdzv_handler, "on_lease", None)
        if on_lease is not None:
            on_lease(self._on_lease)

    def _make_timer_server(self) -> TimerServer:
        settings = self._watchdog
        common: dict[str, Any] = {
            "trust": self._timer_target,
            "on_expired": self._on_timer_expired,
            "dump_signal": settings.dump_signal,
            "dump_grace": settings.dump_grace,
        }
        if settings.file_timer:
            return FileTimerServer(settings.timer_file, **common)
        return TimerServer(**common)

    # -- start ---------------------------------------------------------------------------

    async def _startup(self) -> None:
        """Once per agent: log dir, watchdog, process hygiene."""
        try:
            ensure_dir(self.run_dir)
        except OSError as exc:
            raise StartError(f"log_dir: cannot create {self.run_dir}: {exc.strerror}") from exc
        self.result_file.reserve({"run_id": self.run_id, "state": "INIT", "outcome": "running"})
        self._fd_limit = fdlimits.raise_open_files_limit()
        self._start_events()
        await self.timer_server.start()
        if self._health_settings is not None:
            await self._start_health(self._health_settings)
        if self._watchdog.uninterruptible_timeout > 0:
            self._hang_monitor = UninterruptibleMonitor(
                lambda: [p.pid for p in self._procs.values() if p.returncode is None],
                self._watchdog.uninterruptible_timeout,
                self._on_stuck,
            )
            await self._hang_monitor.start()
        if not self._hygiene:
            return
        if not self._fresh_run_id:
            orphans.kill_leftovers(self.run_id)
        if not orphans.become_subreaper():
            log.warning("Could not become a child subreaper; orphans re-parent to init")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self._reaper.reap)
        self._sigchld_installed = True

    def _start_events(self) -> None:
        sinks: list[Callable[[Event], None]] = [_debug_event]
        if self._event_log:
            try:
                self._event_file = JsonLinesFile(self._event_log)
            except OSError as exc:
                raise StartError(
                    f"event_log: cannot open {self._event_log}: {exc.strerror}"
                ) from None
            sinks.append(self._event_file)
        events = AgentEvents(self.run_id, self._worker_group.spec.role, sinks)
        self.add_observer(events)
        events.emit("agent_started", host=self.hostname, pid=os.getpid())

    async def _start_health(self, settings: HealthSettings) -> None:
        from agentd.health import MAX_CONNECTIONS as HEALTH_MAX_CONNECTIONS
        from agentd.health import HealthCheckServer, LoopLagMonitor
        from agentd.metrics import AgentMetrics

        self.metrics = AgentMetrics(self)
        self.add_observer(self.metrics)
        observe_store = getattr(self.rdzv_handler, "observe_store", None)
        if observe_store is not None:  # a rendezvous over a networked store
            observe_store(self.metrics.store_request)
        self._lag = LoopLagMonitor()
        self._lag.start()
        self.health_server = HealthCheckServer(
            self.liveness_checks, settings.port, settings.timeout, settings.host,
            ready=lambda: self._worker_group.state is WorkerState.HEALTHY,
            status=self.status, metrics=self._render_metrics,
            max_connections=fdlimits.listener_cap(
                HEALTH_MAX_CONNECTIONS, self._fd_limit,
                fdlimits.worker_reserve(self._worker_group.spec.local_world_size), share=0.25,
            ),
        )  # fmt: skip
        await self.health_server.start()

    def _render_metrics(self) -> bytes:
        assert self.metrics is not None and self._lag is not None
        self.metrics.loop_lag.set(self._lag.current_lag())
        return self.metrics.render()

    def liveness_checks(self) -> list[Check]:
        """What ``/livez`` reports: the watchdog is alive and the loop keeps time."""
        from agentd.health import Check

        timeout = self._health_settings.timeout if self._health_settings else 5.0
        lag = self._lag.current_lag() if self._lag else 0.0
        return [
            Check("watchdog", self.timer_server.alive(), f"{len(self.timer_server)} timer(s)"),
            Check("event-loop", lag <= timeout, f"lag {lag * 1000:.1f} ms"),
        ]

    def worker_readings(self) -> list[dict[str, Any]]:
        """Each worker of the current attempt: ranks, pid, state, start time, CPU and RSS."""
        from agentd.metrics import process_tree_usage

        by_rank = {w.local_rank: w for w in self._worker_group.workers}
        readings = []
        for proc in self._procs.values():
            worker = by_rank.get(proc.local_rank)
            running = proc.returncode is None
            cpu, rss = process_tree_usage(proc.pid) if running else (0.0, 0)
            readings.append({
                "local_rank": proc.local_rank,
                "rank": worker.global_rank if worker else -1,
                "pid": proc.pid,
                "state": "running" if running else "exited",
                "exitcode": proc.returncode,
                "started_at": proc.started_at,
                "cpu_seconds": round(cpu, 3),
                "rss_bytes": rss,
            })  # fmt: skip
        return readings

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows (no environment, no output, no tracebacks)."""
        group = self._worker_group
        failure = self.last_failure
        workers = group.workers
        return {
            "run_id": self.run_id,
            "role": group.spec.role,
            "state": group.state.value,
            "host": self.hostname,
            "agent_pid": os.getpid(),
            "started_at": self._started_at,
            "restart_count": self.restart_count,
            "max_restarts": group.spec.max_restarts,
            "attempt": self.attempt,
            "generation": self.generation,
            "rendezvous": self.rdzv_handler.get_backend(),
            "node_rank": group.group_rank,
            "group_world_size": group.group_world_size,
            "world_size": workers[0].world_size if workers else None,
            "watchdog": {
                "alive": self.timer_server.alive(),
                "timers": len(self.timer_server),
                "reaped": self.timer_server.stats["reaped"],
            },
            "workers": self.worker_readings(),
            "last_failure": None if failure is None else {
                "rank": failure.global_rank,
                "local_rank": failure.local_rank,
                "pid": failure.pid,
                "exitcode": failure.exitcode,
                "signal": failure.signal_name,
                "message": failure.message,
                "timestamp": failure.timestamp,
            },
        }  # fmt: skip

    async def _start_guardian(self) -> None:
        """Started after the first workers, so it never delays them; they have a
        parent-death signal meanwhile, and it learns of their groups on start."""
        self._guardian = Guardian(self._mark)
        with self._reaper.spawning():
            await self._guardian.start()
            assert self._guardian.pid is not None
            self._reaper.own(self._guardian.pid)
        if self._lease is not None:
            self._guardian.set_lease(self._lease)

    def _on_lease(self, deadline: float | None) -> None:
        """Our membership lease moved: the guardian kills the workers if it runs out while
        the agent cannot (frozen), so no worker outlives the lease on its ranks."""
        self._lease = deadline
        if self._guardian is not None:
            self._guardian.set_lease(deadline)

    async def _start_workers(self, group: WorkerGroup) -> dict[int, int]:
        self.attempt += 1
        prune_attempts(self.run_dir, self.attempt, self._keep_attempts)
        spec = group.spec
        plans = [self._plan_worker(group, worker) for worker in group.workers]
        with self._reaper.spawning():
            procs = await asyncio.gather(
                *(spawn_worker(w.local_rank, *plan) for w, *plan in plans),
                return_exceptions=True,
            )
            started = [p for p in procs if isinstance(p, WorkerProcess)]
            for proc in started:
                self._reaper.own(proc.pid)
        errors = [p for p in procs if isinstance(p, BaseException)]
        self._procs = {p.local_rank: p for p in started}
        for proc in started:
            proc.exited.add_done_callback(lambda _f: self._wakeup.set())
        if self._hygiene and self._guardian is None:
            await self._start_guardian()
        if self._guardian is not None:
            for proc in started:
                self._guardian.watch(proc.pgid)
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

    def _plan_worker(self, group: WorkerGroup, worker: Worker) -> tuple[Any, ...]:
        spec = group.spec
        rank = worker.local_rank
        wdir = attempt_dir(self.run_dir, self.attempt, rank)
        try:
            ensure_dir(wdir)
        except OSError as exc:  # the worker runs all the same; its output reaches the console
            disk_problem(wdir, exc)
        error_file = wdir / "error.json"
        with contextlib.suppress(FileNotFoundError):
            error_file.unlink()
        env = self._worker_env(group, worker, error_file)
        args = [
            Template(a).safe_substitute(local_rank=rank) if isinstance(a, str) else a
            for a in spec.args
        ]
        if isinstance(spec.entrypoint, str):
            argv = [spec.entrypoint, *map(str, args)]
        else:
            from agentd.function_worker import write_call

            call, result = wdir / "call.pickle", wdir / "return.pickle"
            write_call(call, spec.entrypoint, tuple(args))
            argv = [sys.executable, "-u", "-m", "agentd.function_worker", str(call), str(result)]
        shown = spec.local_ranks_filter is None or rank in spec.local_ranks_filter
        prefix = spec.log_line_prefix_template.format(
            role=spec.role,
            local_rank=rank,
            rank=worker.global_rank,
            host=self.hostname,
            node_rank=group.group_rank,
            attempt=self.attempt,
        )
        routes = [
            plan_route(
                redirect=bool(std_for(spec.redirects, rank) & std),
                tee=bool(std_for(spec.tee, rank) & std),
                shown=shown,
                is_stderr=std is Std.ERR,
                file_path=wdir / name,
                prefix=prefix,
            )
            for std, name in ((Std.OUT, "stdout.log"), (Std.ERR, "stderr.log"))
        ]
        return worker, argv, env, routes[0], routes[1]

    def _worker_env(self, group: WorkerGroup, worker: Worker, error_file: Path) -> dict[str, str]:
        timer_file = (
            self.timer_server.path if isinstance(self.timer_server, FileTimerServer) else None
        )
        return worker_env(group, worker, str(error_file), WorkerEnvContext(
            run_id=self.run_id, restart_count=self.restart_count,
            max_restarts=group.spec.max_restarts,
            use_agent_store=self.rdzv_handler.use_agent_store, owner_mark=self._mark,
            attempt=self.attempt, timer_file=timer_file,
        ))  # fmt: skip

    # -- monitor -------------------------------------------------------------------------

    async def _monitor_workers(self, group: WorkerGroup) -> RunResult:
        await self._wakeup.wait()
        self._wakeup.clear()
        return await self._check_workers(group)

    async def _check_workers(self, group: WorkerGroup) -> RunResult:
        procs = self._procs
        self.timer_server.clear_timers(p.pid for p in procs.values() if p.returncode is not None)
        if self._unhealthy:
            return self._unhealthy_result(group)
        failed = [p for p in procs.values() if p.returncode not in (None, 0)]
        if failed:
            await asyncio.wait([p.pipes_closed for p in failed], timeout=_TAIL_WAIT)
            by_rank = {w.local_rank: w for w in group.workers}
            failures = {
                by_rank[p.local_rank].global_rank: self._failure(group, by_rank[p.local_rank], p)
                for p in failed
            }
            return RunResult(WorkerState.FAILED, failures=failures)
        if procs and all(p.returncode == 0 for p in procs.values()):
            values: dict[int, Any] = {}
            if not isinstance(group.spec.entrypoint, str):
                from agentd.function_worker import read_result

                for worker in group.workers:
                    wdir = attempt_dir(self.run_dir, self.attempt, worker.local_rank)
                    values[worker.global_rank] = read_result(wdir / "return.pickle")
            return RunResult(WorkerState.SUCCEEDED, return_values=values)
        return RunResult(WorkerState.HEALTHY)

    # -- watchdog ------------------------------------------------------------------------

    def _timer_target(self, pid: int) -> int | None:
        """The process group to signal for a timer of ``pid``; None unless it is ours.

        Ours: in the process group of one of our running workers, or (a descendant that
        left its group) carrying this agent's owner mark. Never the agent's own group.
        """
        try:
            pgid = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            return None
        if pgid == os.getpgid(0):
            return None
        if any(p.pgid == pgid and p.returncode is None for p in self._procs.values()):
            return pgid
        return pgid if orphans.read_mark(pid) == self._mark else None

    def _on_timer_expired(self, request: TimerRequest, pgid: int | None) -> None:
        if pgid is None:
            return  # signal <= 0: reported, not enforced
        why = (
            f"timer expired: scope {request.scope_id!r} of pid {request.worker_id}, "
            f"reaped with {signal_name(request.signal)}"
        )
        self._unhealthy.append((request.worker_id, why, time.time()))
        self._wakeup.set()

    def _on_stuck(self, pid: int, seconds: float) -> None:
        self._unhealthy.append(
            (pid, f"in uninterruptible sleep (D state) for {seconds:.1f}s", time.time())
        )
        self._wakeup.set()

    def _unhealthy_result(self, group: WorkerGroup) -> RunResult:
        by_rank = {w.local_rank: w for w in group.workers}
        failures: dict[int, WorkerFailure] = {}
        for pid, why, when in self._unhealthy:
            proc = self._proc_of(pid)
            if proc is None:
                continue
            worker = by_rank[proc.local_rank]
            failures[worker.global_rank] = dataclasses.replace(
                self._failure(group, worker, proc),
                exitcode=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
                message=why,
                timestamp=when,
            )
        return RunResult(WorkerState.UNHEALTHY, failures=failures)

    def _proc_of(self, pid: int) -> WorkerProcess | None:
        """The worker whose tree ``pid`` is in (by pid, then by process group)."""
        for proc in self._procs.values():
            if proc.pid == pid:
                return proc
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(pid)
            return next((p for p in self._procs.values() if p.pgid == pgid), None)
        return None

    def _failure(self, group: WorkerGroup, worker: Worker, proc: WorkerProcess) -> WorkerFailure:
        from agentd.errors import read_error_file

        error_file = attempt_dir(self.run_dir, self.attempt, worker.local_rank) / "error.json"
        content = read_error_file(str(error_file))
        return WorkerFailure(
            local_rank=worker.local_rank,
            global_rank=worker.global_rank,
            role=group.spec.role,
            pid=proc.pid,
            exitcode=proc.returncode if proc.returncode is not None else -1,
            timestamp=proc.exited_at or time.time(),
            message=content.message if content else "",
            traceback=content.traceback if content else "",
            stderr_tail=proc.stderr.tail() if proc.stderr is not None else "",
            error_file=str(error_file) if content else "",
            host=self.hostname,
            node_rank=group.group_rank or 0,
        )

    # -- stop ----------------------------------------------------------------------------

    async def _stop_workers(self, group: WorkerGroup) -> None:
        procs = list(self._procs.values())
        if not procs:
            return
        spec = group.spec
        running = sum(p.returncode is None for p in procs)
        log.log(
            logging.INFO if running else logging.DEBUG,
            "[%s] Stopping %d running worker(s) with %s",
            spec.role,
            running,
            spec.stop_signal.name,
        )
        strays: list[int] = []
        try:
            strays = await stop_workers(
                procs, spec.stop_signal, self._stop_timeout(), self._force, self._mark
            )
        finally:
            if strays:
                log.warning(
                    "[%s] Killed %d process(es) that left their worker's group: %s",
                    spec.role,
                    len(strays),
                    strays,
                )
            for proc in procs:
                self._reaper.disown(proc.pid)
                if self._guardian is not None:
                    self._guardian.unwatch(proc.pgid)
            for worker in group.workers:
                worker.id = None
            self.timer_server.clear_timers(p.pid for p in procs)
            self._unhealthy.clear()
            self._procs = {}
            level = logging.INFO if running else logging.DEBUG
            log.log(level, "[%s] Stopped worker group", spec.role)

    async def _shutdown(self) -> None:
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
            if self._hang_monitor is not None:
                await self._hang_monitor.stop()
            await self.timer_server.stop()
            if self._lag is not None:
                self._lag.stop()
            if self.health_server is not None:
                await self.health_server.stop()
            if self._event_file is not None:
                self._event_file.close()
            if self._guardian is not None:
                await self._guardian.stop()
                self._guardian = None
            if self._sigchld_installed:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGCHLD)
                self._sigchld_installed = False
                self._reaper.reap()
            self._write_result()

    def _write_result(self) -> None:
        """Write ``result.json`` in the run's log directory (any outcome)."""
        group = self._worker_group
        doc = outcome(
            {"run_id": self.run_id, "role": group.spec.role, "state": group.state.value,
             "restarts": self.restart_count, "attempts": self.attempt + 1,
             "host": self.hostname},
            self.last_result, self.last_failure, self.exit_error,
        )  # fmt: skip
        if self.run_dir.is_dir():
            self.result_written = self.result_file.write(doc)

    def failure_report(self) -> str:
        """The text report of the last run's failure (empty when it did not fail)."""
        result = self.last_result
        if result is None or not result.is_failed():
            return ""
        from agentd.errors import format_failure_report

        entrypoint = self._worker_group.spec.get_entrypoint_name()
        return format_failure_report(result, self.run_id, entrypoint)
