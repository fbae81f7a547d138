"""The HTTP health endpoint: ``/livez`` (``/healthz``), ``/readyz``, ``/status``, ``/metrics``.

Served by aiohttp inside the agent's own loop (``AppRunner`` + ``TCPSite``, never
``run_app``). Read-only but for ``POST /drain`` (with a token, and only where the agent
can drain: :mod:`agentd.drain.http`): other methods get 405 and unknown paths
404. ``/livez`` answers from state alone and never depends on the store or other hosts.
aiohttp is imported when a server starts, so an agent without one never loads it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

from agentd.support.http_site import Limits, serve_app
from agentd.support.sync_bridge import StartedInBackground

log = logging.getLogger(__name__)

LAG_INTERVAL = 1.0
MAX_CONNECTIONS = 64
"""Probes and scrapes need a few; a flood of idle connections gets 503 beyond this."""
IDLE_TIMEOUT = 5.0
"""Seconds a connection may take to send its request, or idle between requests."""


@dataclass(frozen=True)
class Check:
    """One liveness check: its name, whether it passed, and a word on why."""

    name: str
    ok: bool
    detail: str = ""


AliveCallback = Callable[[], "bool | float | list[Check]"]
"""Liveness: a bool, the epoch time of the last heartbeat (the seed's form), or checks."""


class LoopLagMonitor:
    """Measures how late the loop runs a callback scheduled a second ahead.

    The one periodic wake-up of an agent that serves health (once a second); it tells a
    loop that answers apart from one that is starved.
    """

    def __init__(self, interval: float = LAG_INTERVAL) -> None:
        self.interval = interval
        self.lag = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.interval
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def current_lag(self) -> float:
        """The last lag measured, or how overdue the pending tick is, if that is more."""
        overdue = asyncio.get_running_loop().time() - self._due if self._handle else 0.0
        return max(self.lag, overdue)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self.lag = max(0.0, loop.time() - self._due)
        self._due = loop.time() + self.interval
        self._handle = loop.call_at(self._due, self._tick)


JOB_TIMEOUT = 2.0
"""The longest ``/job`` waits for the store (within ``agentd status``'s 3 s default)."""


class HealthCheckServer(StartedInBackground):
    """Serves the health endpoints on ``host:port`` (port 0: an ephemeral one).

    torch's API: ``start()`` serves on a daemon thread and returns, ``stop()`` ends it;
    on a running loop, ``await start_async()``/``stop_async()`` serve on that loop.

    ``alive_callback`` decides ``/livez``; ``ready``, ``status``, ``metrics`` and ``job``
    (each optional) provide ``/readyz``, ``/status``, ``/metrics`` and ``/job`` (the job
    view: a store that does not answer it is a 503 naming why; ``job`` is given a
    follower's interval, :func:`agentd.support.followers.follow_interval`) with its page
    at ``/``;
    ``logs`` answers ``GET /logs`` (token-guarded: see :mod:`agentd.joblogs.http`).
    """

    def __init__(
        self,
        alive_callback: AliveCallback,
        port: int,
        timeout: float,
        host: str = "127.0.0.1",
        *,
        ready: Callable[[], bool] | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
        metrics: Callable[[], bytes] | None = None,
        job: Callable[[float | None], Awaitable[dict[str, Any]]] | None = None,
        logs: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        drain: Callable[[str], dict[str, Any]] | None = None,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._alive = alive_callback
        self._timeout = timeout
        self._ready = ready
        self._status = status
        self._metrics = metrics
        self._job = job
        self._logs = logs
        self._drain = drain
        self._token = token
        self._ssl = ssl_context
        self._host = host
        self._requested_port = port
        self._runner: web.AppRunner | None = None
        self._limits = Limits(max_connections=max_connections, idle_timeout=IDLE_TIMEOUT)
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{'https' if self._ssl is not None else 'http'}://{host}:{self.port}"

    async def start_async(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/healthz", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status_handler)
        app.router.add_get("/metrics", self._metrics_handler)
        if self._job is not None:
            app.router.add_get("/job", self._job_handler)
            app.router.add_get("/", self._page_handler)
            app.router.add_get("/page/{name}", self._page_handler)
        if self._logs is not None:
            app.router.add_get("/logs", self._logs)
        if self._drain is not None:
            app.router.add_post("/drain", self._drain_handler)
        self._runner, self.port = await serve_app(
            app,
            self._host,
            self._requested_port,
            "health_port",
            self._limits,
            ssl_context=self._ssl,
            host_what="health_host",
        )
        log.info("Health endpoint on %s (/livez /readyz /status /metrics /job; page /)", self.url)

    async def stop_async(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers --------------------------------------------------------------------------

    def checks(self) -> list[Check]:
        """The liveness checks, whatever form the callback answers in."""
        answer = self._alive()
        if isinstance(answer, list):
            return answer
        if isinstance(answer, bool):
            return [Check("alive", answer)]
        age = time.time() - float(answer)  # the seed's form: the last heartbeat's time
        return [Check("heartbeat", age <= self._timeout, f"last {age:.1f}s ago")]

    async def _livez(self, request: web.Request) -> web.Response:
        checks = self.checks()
        return _probe_response(all(c.ok for c in checks), checks, "verbose" in request.query)

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = self._ready() if self._ready else True
        checks = [Check("worker-group", ready, "HEALTHY" if ready else "not HEALTHY")]
        return _probe_response(ready, checks, "verbose" in request.query)

    async def _status_handler(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if self._status is None:
            raise web.HTTPNotFound()
        return web.Response(
            text=json.dumps(self._status(), indent=2) + "\n", content_type="application/json"
        )

    async def _job_handler(self, request: web.Request) -> web.Response:
        from aiohttp import web

        from agentd.exceptions import AgentdError
        from agentd.support.followers import follow_interval

        assert self._job is not None
        try:
            async with asyncio.timeout(JOB_TIMEOUT):
                doc, status = await self._job(follow_interval(request.headers)), 200
        except (AgentdError, TimeoutError) as exc:  # the store's trouble: say so, go on
            why = str(exc) or f"no answer within {JOB_TIMEOUT:g}s"
            doc, status = {"error": f"the job view needs the store: {why}"}, 503
        return web.Response(
            text=json.dumps(doc, indent=2) + "\n", status=status, content_type="application/json"
        )

    async def _page_handler(self, request: web.Request) -> web.Response:
        """The job page (``/``) and its files (``/page/<name>``), read-only."""
        from aiohttp import web

        from agentd.jobview.web import SECURITY_HEADERS, page_file

        found = page_file(request.match_info.get("name", "index.html"))
        if found is None:
            raise web.HTTPNotFound()
        body, content_type = found
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS
        )

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST

        if self._metrics is None:
            raise web.HTTPNotFound()

        response = web.Response(body=self._metrics())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _drain_handler(self, request: web.Request) -> web.Response:
        """``POST /drain`` with the bearer token, and optionally ``{"reason": "..."}``."""
        from agentd.drain.http import drain_response

        assert self._drain is not None
        return await drain_response(request, self._token, self._drain)


def _probe_response(ok: bool, checks: list[Check], verbose: bool) -> web.Response:
    from aiohttp import web

    if verbose:
        lines = [
            f"[{'+' if c.ok else '-'}]{c.name} {'ok' if c.ok else 'failed'}"
            + (f": {c.detail}" if c.detail else "")
            for c in checks
        ]
        text = "\n".join(lines) + f"\n{'ok' if ok else 'unhealthy'}\n"
    else:
        text = "ok\n" if ok else "unhealthy\n"
    return web.Response(text=text, status=200 if ok else 503)


def create_healthcheck_server(
    alive_callback: AliveCallback, port: int, timeout: float, **kwargs: Any
) -> HealthCheckServer:
    """The seed's factory: a :class:`HealthCheckServer`, not yet started."""
    return HealthCheckServer(alive_callback, port, timeout, **kwargs)
