"""The health endpoint over real HTTP against a running LocalElasticAgent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentd import AgentSettings, LocalElasticAgent, WorkerSpec, WorkerState
from agentd.exceptions import StartError
from agentd.health.server import Check, HealthCheckServer, create_healthcheck_server
from agentd.health.settings import HealthSettings
from agentd.rendezvous.static import StaticRendezvous
from agentd.restart_policy import RestartBackoff
from agentd.support import procfs
from agentd.timer.api import TimerRequest
from tests.conftest import WORKER


class GatedRendezvous(StaticRendezvous):
    """Holds the first rendezvous until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__("health-run")
        self.gate = asyncio.Event()

    async def next_rendezvous(self):
        await self.gate.wait()
        return await super().next_rendezvous()


def agent_with_health(tmp_path, args, rdzv=None, **kw) -> LocalElasticAgent:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=kw.pop("n", 2),
        entrypoint=sys.executable,
        args=("-u", WORKER, *args),
        rdzv_handler=rdzv or StaticRendezvous("h"),
        env={"SECRET_TOKEN": "hunter2"},
        **kw,
    )
    health = AgentSettings(health=HealthSettings(port=0))
    return LocalElasticAgent(spec, log_dir=tmp_path, settings=health)


@contextlib.asynccontextmanager
async def healthy_agent(
    tmp_path, n: int
) -> AsyncIterator[tuple[LocalElasticAgent, aiohttp.ClientSession]]:
    """An agent of ``n`` sleeping workers, once HEALTHY, and an HTTP session; stopped after."""
    agent = agent_with_health(tmp_path, ["sleep"], n=n)
    task = asyncio.ensure_future(agent.run_async("trainer"))
    try:
        async with aiohttp.ClientSession() as http:
            await until(lambda: _state(agent, WorkerState.HEALTHY))
            yield agent, http
    finally:
        agent.request_stop()
        with pytest.raises(Exception, match="stopped"):
            await task


async def until(predicate) -> None:
    async with asyncio.timeout(20):
        while not await predicate():
            await asyncio.sleep(0.01)


async def code(session: aiohttp.ClientSession, url: str, method: str = "GET") -> int:
    async with session.request(method, url) as response:
        return response.status


async def test_codes_through_init_healthy_restart_and_stop(tmp_path):
    rdzv = GatedRendezvous()
    agent = agent_with_health(
        tmp_path,
        ["flaky", "--until-attempt", "1", "--code", "3"],
        rdzv=rdzv,
        max_restarts=1,
        restart_backoff=RestartBackoff(0.5, 0.5, 1.0, 0.0),
    )
    task = asyncio.ensure_future(agent.run_async("trainer"))
    async with aiohttp.ClientSession() as http:
        await until(lambda: _up(agent))
        url = agent.health_server.url
        # INIT: up before rendezvous; alive but not ready
        assert agent.get_worker_group().state is WorkerState.INIT
        assert await code(http, url + "/livez") == 200
        assert await code(http, url + "/readyz") == 503
        rdzv.gate.set()
        # the first attempt fails, and the backoff holds the group STOPPED for 0.5 s
        await until(lambda: _state(agent, WorkerState.STOPPED))
        assert await code(http, url + "/readyz") == 503
        assert await code(http, url + "/livez") == 200
        result = await task
    assert result.state is WorkerState.SUCCEEDED


async def test_ready_while_healthy_then_stopped(tmp_path):
    agent = agent_with_health(tmp_path, ["sleep"])
    task = asyncio.ensure_future(agent.run_async("trainer"))
    async with aiohttp.ClientSession() as http:
        await until(lambda: _state(agent, WorkerState.HEALTHY))
        url = agent.health_server.url
        assert await code(http, url + "/readyz") == 200
        assert await code(http, url + "/healthz") == 200
        async with http.get(url + "/livez?verbose") as response:
            text = await response.text()
        assert "[+]watchdog ok" in text and "[+]event-loop ok" in text and text.endswith("ok\n")
        agent.request_stop()
        with pytest.raises(Exception, match="stopped by SIGTERM"):
            await task
    with pytest.raises(aiohttp.ClientConnectionError):  # the server is gone with the agent
        async with aiohttp.ClientSession() as http:
            await code(http, url + "/livez")


async def test_livez_fails_when_the_watchdog_stalls_or_dies(tmp_path):
    async with healthy_agent(tmp_path, n=1) as (agent, http):
        url = agent.health_server.url
        assert await code(http, url + "/livez") == 200  # the watchdog runs, asleep
        timers = agent.timer_server
        # a stall: a deadline the sleeping watchdog was never woken for, now overdue
        worker_pid = agent.get_worker_group().workers[0].id
        timers._wake = asyncio.Event()  # detach the task's wake-up: it will not hear this
        timers.register_timers([TimerRequest(worker_pid, "stalled", time.time() - 10)])
        async with http.get(url + "/livez?verbose") as response:
            assert response.status == 503
            assert "[-]watchdog failed" in await response.text()
        timers.clear_timers([worker_pid])
        assert await code(http, url + "/livez") == 200
        # a crash: the watchdog task is gone
        timers._task.cancel()
        await asyncio.sleep(0)
        assert await code(http, url + "/livez") == 503


async def test_status_metrics_and_errors(tmp_path):
    async with healthy_agent(tmp_path, n=2) as (agent, http):
        url = agent.health_server.url

        async def resident() -> bool:  # a worker read as it execs has no pages yet (CI, 12-04)
            async with http.get(url + "/status") as response:
                return all(w["rss_bytes"] > 0 for w in (await response.json())["workers"])

        await until(resident)
        async with http.get(url + "/status") as response:
            assert response.content_type == "application/json"
            body = await response.text()
        doc = json.loads(body)
        assert {
            "run_id",
            "role",
            "state",
            "restart_count",
            "generation",
            "node_rank",
            "world_size",
            "workers",
            "last_failure",
            "watchdog",
        } <= set(doc)
        assert doc["state"] == "HEALTHY" and doc["world_size"] == 2
        assert [w["rank"] for w in doc["workers"]] == [0, 1]
        assert all(w["rss_bytes"] > 0 and w["state"] == "running" for w in doc["workers"])
        assert "hunter2" not in body and "SECRET_TOKEN" not in body
        async with http.get(url + "/metrics") as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(await response.text())}
        state = {s.labels["state"]: s.value for s in families["agentd_worker_group_state"].samples}
        assert state["HEALTHY"] == 1 and state["INIT"] == 0
        assert families["agentd_watchdog_alive"].samples[0].value == 1
        assert {
            s.labels["phase"]
            for s in families["agentd_recovery_phase_seconds"].samples
            if s.name.endswith("_count")
        } == {"rendezvous", "start"}
        assert len(families["agentd_worker_rss_bytes"].samples) == 2
        assert "agentd_event_loop_lag_seconds" in families
        assert await code(http, url + "/nope") == 404
        for method in ("POST", "PUT", "DELETE"):
            assert await code(http, url + "/livez", method) == 405
            assert await code(http, url + "/status", method) == 405


async def test_status_and_metrics_of_four_workers_read_proc_once_a_second(tmp_path, monkeypatch):
    """Each worker's CPU and RSS count its children: one pass over /proc finds them all,
    kept for the requests of the next second (a pass per worker, at each request, held
    the agent's loop 0.3 s on a host of 1,000 processes: bench/bench_status.py)."""
    passes = []  # every listing of /proc in this process: ours, psutil's (as bytes)
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: (passes.append(path), listdir(path))[1])
    async with healthy_agent(tmp_path, n=4) as (agent, http):
        url = agent.health_server.url

        async def resident() -> bool:  # a worker's exec may not have faulted a page in yet
            monkeypatch.setattr(procfs.ProcessTable, "_recent", None)
            async with http.get(url + "/status") as response:
                return all(w["rss_bytes"] > 0 for w in (await response.json())["workers"])

        await until(resident)  # CI: one of 4 showed 0 bytes right after its start
        passes.clear()
        monkeypatch.setattr(procfs.ProcessTable, "_recent", None)
        monkeypatch.setattr(procfs.ProcessTable, "MAX_AGE", 60.0)  # a loaded machine
        for path in ("/status", "/metrics", "/status"):
            async with http.get(url + path) as response:
                assert response.status == 200
                if path == "/status":
                    workers = (await response.json())["workers"]
                    assert len(workers) == 4 and all(w["rss_bytes"] > 0 for w in workers)
        assert [os.fsdecode(path) for path in passes].count("/proc") == 1


async def test_seed_style_server_with_a_heartbeat_callback():
    beat = [time.time()]
    server = create_healthcheck_server(lambda: beat[0], port=0, timeout=5)
    assert isinstance(server, HealthCheckServer)
    await server.start_async()
    try:
        async with aiohttp.ClientSession() as http:
            assert await code(http, server.url + "/livez") == 200
            beat[0] -= 60  # the last heartbeat is a minute old
            assert await code(http, server.url + "/livez") == 503
            assert await code(http, server.url + "/status") == 404  # none was given
    finally:
        await server.stop_async()
    assert server.checks()[0] == Check("heartbeat", False, server.checks()[0].detail)


async def test_job_view_answers_503_naming_the_store_trouble(monkeypatch):
    from agentd.health import server as health_server
    from agentd.store.api import StoreUnavailable

    monkeypatch.setattr(health_server, "JOB_TIMEOUT", 0.2)
    answers = iter([StoreUnavailable("127.0.0.1:9: connection refused"), None])

    async def job(every: float | None) -> dict:
        trouble = next(answers)
        if trouble is not None:
            raise trouble
        await asyncio.Event().wait()  # a store that never answers
        return {}

    server = HealthCheckServer(lambda: True, 0, 5, job=job)
    await server.start_async()
    try:
        async with aiohttp.ClientSession() as http:
            for why in ("127.0.0.1:9: connection refused", "no answer within 0.2s"):
                async with http.get(server.url + "/job") as answer:
                    doc = await answer.json()
                assert answer.status == 503
                assert doc == {"error": f"the job view needs the store: {why}"}
    finally:
        await server.stop_async()


async def test_port_in_use_is_a_start_error():
    with socket.socket() as holder:  # a listener that does not share its port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        blocked = create_healthcheck_server(lambda: True, port=holder.getsockname()[1], timeout=5)
        with pytest.raises(StartError, match="health_port: cannot listen"):
            await blocked.start_async()


async def _up(agent) -> bool:
    return agent.health_server is not None and agent.health_server.port != 0


async def _state(agent, state) -> bool:
    return agent.get_worker_group().state is state
