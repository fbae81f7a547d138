"""The health service: ``/livez`` ``/readyz`` ``/status`` ``/metrics`` for one agent.

Everything here is a read-only view of the agent, taken when a request asks: the
watchdog's state and the loop's lag for liveness, the group's state for readiness, the
run and its workers for status, a Prometheus registry for metrics. Only the loop-lag
sample wakes the agent (once a second), and only while the endpoint is served.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.exceptions import ConfigError, StartError
from agentd.group import WorkerState
from agentd.health.history import RestartHistory
from agentd.rendezvous.api import ReportsStore, ShowsJob
from agentd.store import token_file
from agentd.support import fdlimits

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from agentd.health.metrics import AgentMetrics
    from agentd.health.server import Check, HealthCheckServer, LoopLagMonitor
    from agentd.health.settings import HealthSettings
    from agentd.joblogs.reader import LogReader
    from agentd.jobview.reading import JobReading
    from agentd.support.followers import Followers
    from agentd.view import AgentView


class HealthService:
    """Serves ``agent``'s health endpoint as ``settings`` say."""

    def __init__(self, agent: AgentView, settings: HealthSettings) -> None:
        self._agent = agent
        self.settings = settings
        self.server: HealthCheckServer | None = None
        self.metrics: AgentMetrics | None = None
        self._lag: LoopLagMonitor | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._token = settings.token or token_file.new_token()
        self._published: int | None = None
        self.history = RestartHistory()
        self._log_reader: LogReader | None = None
        self._followers: Followers | None = None  # of /logs
        self._job_reading: JobReading | None = None
        self._watchers: Followers | None = None  # of /job

    async def start(self) -> None:
        from agentd.health.metrics import AgentMetrics
        from agentd.health.server import MAX_CONNECTIONS, HealthCheckServer, LoopLagMonitor
        from agentd.telemetry.metrics_api import subscribe

        agent, settings = self._agent, self.settings
        self.metrics = AgentMetrics(agent)
        agent.add_observer(self.metrics)
        agent.add_observer(self.history)
        self._unsubscribe = subscribe(self.metrics.put_metric)  # put_metric -> /metrics
        if isinstance(agent.rdzv_handler, ReportsStore):  # a rendezvous over a networked store
            agent.rdzv_handler.observe_store(self.metrics.store_request)
        self._lag = LoopLagMonitor()
        self._lag.start()
        workers = agent.get_worker_group().spec.local_world_size
        cap = fdlimits.listener_cap(
            MAX_CONNECTIONS,
            fdlimits.raise_open_files_limit(),
            fdlimits.worker_reserve(workers),
            share=0.25,
        )
        self.server = HealthCheckServer(
            self.liveness_checks,
            settings.port,
            settings.timeout,
            settings.host,
            ready=lambda: agent.get_worker_group().state is WorkerState.HEALTHY,
            status=lambda: status_document(agent, self.history),
            metrics=self._render_metrics,
            job=self._job,
            logs=self._logs,
            max_connections=cap,
            drain=self._drain,
            token=self._token,
            ssl_context=tls_context(settings.cert, settings.key) if settings.cert else None,
        )
        try:
            await self.server.start_async()
        except StartError as exc:
            if settings.required:
                raise
            log.warning("No health endpoint for this agent: %s", exc)
            self.server = None
            await self.stop()
            return
        if settings.token is None:  # POST /drain's, readable by this user only
            try:
                token_file.publish(self.server.port, self._token, "health")
                self._published = self.server.port
            except (OSError, StartError) as exc:
                log.warning("POST /drain is off: cannot publish its token: %s", exc)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._lag is not None:
            self._lag.stop()
            self._lag = None
        if self.server is not None:  # someone followed: it is told of the end too
            ends = [f.end() for f in (self._followers, self._watchers) if f is not None]
            await asyncio.gather(*ends)
            await self.server.stop_async()
        if self._published is not None:
            token_file.withdraw(self._published, self._token, "health")
            self._published = None

    @property
    def url(self) -> str | None:
        """The endpoint's URL while it is served."""
        return self.server.url if self.server is not None else None

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        from agentd.joblogs.http import logs_response
        from agentd.joblogs.reader import LogReader
        from agentd.support.followers import Followers

        agent = self._agent
        if self._log_reader is None or self._followers is None:
            self._log_reader, self._followers = LogReader(agent.run_dir), Followers()
        handler = agent.rdzv_handler
        who: dict[str, Any] = (
            {"node": handler.job.node_id, "host": handler.job.addr}
            if isinstance(handler, ShowsJob)
            else {"node": agent.hostname, "host": agent.hostname}
        )
        who["keeps_files"] = agent.get_worker_group().spec.keeps_log_files
        if agent.logs_specs is not None:
            from agentd.workers.logs_specs import overrides_reify

            if overrides_reify(agent.logs_specs):
                who["placed_by"] = type(agent.logs_specs).__name__
        return await logs_response(
            request,
            self._token,
            self._log_reader,
            lambda: agent.attempt,
            lambda: who,
            self._followers,
        )

    async def _job(self, every: float | None) -> dict[str, Any]:
        """The job view, for a watcher asking every ``every`` seconds (None: not one):
        the agent's end waits for one to be shown how the run ended."""
        from agentd.jobview.reading import JobReading
        from agentd.support.followers import Followers

        if self._job_reading is None or self._watchers is None:
            self._job_reading, self._watchers = JobReading(self._agent), Followers()
        self._watchers.asked(every)
        doc = await self._job_reading.read()
        if every is not None and doc["ended"]:
            self._watchers.told()
        return doc

    def _drain(self, reason: str) -> dict[str, Any]:
        self._agent.request_drain(reason)
        return {"draining": True, "reason": reason}

    def liveness_checks(self) -> list[Check]:
        """What ``/livez`` reports: the watchdog is alive and the loop keeps time."""
        from agentd.health.server import Check

        timers = self._agent.timer_server
        lag = self._lag.current_lag() if self._lag else 0.0
        return [
            Check("watchdog", timers.alive(), f"{len(timers)} timer(s)"),
            Check("event-loop", lag <= self.settings.timeout, f"lag {lag * 1000:.1f} ms"),
        ]

    def _render_metrics(self) -> bytes:
        assert self.metrics is not None and self._lag is not None
        self.metrics.loop_lag.set(self._lag.current_lag())
        return self.metrics.render()


def worker_readings(agent: AgentView) -> list[dict[str, Any]]:
    """Each worker of the current attempt: ranks, pid, state, start time, CPU and RSS."""
    from agentd.support.procfs import ProcessTable

    by_rank = {w.local_rank: w for w in agent.get_worker_group().workers}
    procs = agent.worker_processes().values()
    table = ProcessTable.recent(proc.pid for proc in procs if proc.returncode is None)
    readings = []
    for proc in procs:
        worker = by_rank.get(proc.local_rank)
        running = proc.returncode is None
        cpu, rss = table.tree_usage(proc.pid) if running else (0.0, 0)
        readings.append(
            {
                "local_rank": proc.local_rank,
                "rank": worker.global_rank if worker else -1,
                "pid": proc.pid,
                "state": "running" if running else "exited",
                "exitcode": proc.returncode,
                "started_at": proc.started_at,
                "cpu_seconds": round(cpu, 3),
                "rss_bytes": rss,
            }
        )
    return readings


def status_document(agent: AgentView, history: RestartHistory | None = None) -> dict[str, Any]:
    """What ``/status`` shows (no environment, no output, no tracebacks, no secrets);
    ``history``: the restarts to list (none without the health service's)."""
    group = agent.get_worker_group()
    failure = agent.last_failure
    workers = group.workers
    timers = agent.timer_server
    handler = agent.rdzv_handler
    return {
        "run_id": agent.run_id,
        "role": group.spec.role,
        "state": group.state.value,
        "host": agent.hostname,
        "agent_pid": os.getpid(),
        "started_at": agent.started_at,
        "restart_count": agent.restart_count,
        "max_restarts": group.spec.max_restarts,
        "restarts_by_kind": agent.restart_kinds,
        "inprocess": agent.inprocess_status(),
        "attempt": agent.attempt,
        "generation": agent.generation,
        "rendezvous": agent.rdzv_handler.get_backend(),
        "store": handler.store_status() if isinstance(handler, ReportsStore) else None,
        "node_rank": group.group_rank,
        "group_world_size": group.group_world_size,
        "world_size": workers[0].world_size if workers else None,
        "watchdog": {
            "alive": timers.alive(),
            "timers": len(timers),
            "reaped": timers.stats["reaped"],
        },
        "workers": worker_readings(agent),
        "preload": agent.preload_status(),
        "heartbeats": agent.heartbeat_status(),
        "node_checks": agent.node_check_status(),
        "drain": agent.drain_status(),
        "nodes": agent.slow_node_status(),
        "recent_restarts": history.document() if history is not None else [],
        "last_failure": None
        if failure is None
        else {
            "rank": failure.global_rank,
            "local_rank": failure.local_rank,
            "pid": failure.pid,
            "exitcode": failure.exitcode,
            "signal": failure.signal_name() or None,
            "message": failure.message,
            "timestamp": failure.timestamp,
        },
    }


def tls_context(cert: str, key: str | None) -> ssl.SSLContext:
    """The health endpoint's server context (ConfigError naming the flag when the files
    cannot be loaded)."""
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ConfigError(f"--health-cert: {cert!r} with --health-key {key!r}: {reason}") from None
    return context
