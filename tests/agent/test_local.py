"""LocalElasticAgent through its Python API, with real worker processes."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest

from agentd import LocalElasticAgent, WorkerSpec, WorkerState
from agentd.exceptions import AgentStopped, IllegalTransition
from agentd.rendezvous.static import StaticRendezvous
from agentd.restart_policy import RestartBackoff
from agentd.view import AgentObserver
from tests.conftest import WORKER, pid_alive
from tests.workers import functions


def make_agent(tmp_path, entrypoint, args=(), **kw) -> LocalElasticAgent:
    spec = WorkerSpec(
        role="trainer",
        local_world_size=kw.pop("n", 2),
        entrypoint=entrypoint,
        args=args,
        rdzv_handler=StaticRendezvous("api-run"),
        **kw,
    )
    return LocalElasticAgent(spec, log_dir=tmp_path)


async def test_function_entrypoint_return_values(tmp_path):
    agent = make_agent(tmp_path, functions.rank_times, (10,), n=3)
    result = await agent.run_async("trainer")
    assert result.state is WorkerState.SUCCEEDED
    assert result.return_values == {r: {"rank": r, "value": 10 * r} for r in range(3)}


async def test_function_entrypoint_failure_uses_error_file(tmp_path):
    agent = make_agent(tmp_path, functions.raise_on_rank, (1,))
    result = await agent.run_async("trainer")
    assert result.is_failed()
    root = result.root_cause
    assert root.global_rank == 1 and root.exitcode == 1
    assert root.message == "RuntimeError: function failed on rank 1"
    assert "raise_on_rank" in root.traceback
    assert "RuntimeError" in agent.failure_report()


async def test_states_seen_by_listener_and_restart_count(tmp_path):
    agent = make_agent(
        tmp_path, sys.executable, ("-u", WORKER, "flaky", "--until-attempt", "1"), max_restarts=2
    )
    seen: list[tuple[str, str]] = []
    phases: list[str] = []

    class Watcher(AgentObserver):
        def state_changed(self, old, new, reason):
            seen.append((old.value, new.value))

        def phase_timed(self, phase, seconds):
            assert seconds >= 0
            phases.append(phase)

    agent.add_observer(Watcher())
    result = await agent.run_async("trainer")
    assert result.state is WorkerState.SUCCEEDED
    assert agent.restart_count == 1
    assert seen == [
        ("INIT", "HEALTHY"),
        ("HEALTHY", "FAILED"),
        ("FAILED", "STOPPED"),
        ("STOPPED", "INIT"),
        ("INIT", "HEALTHY"),
        ("HEALTHY", "SUCCEEDED"),
    ]
    assert agent.get_worker_group().state is WorkerState.SUCCEEDED
    assert phases == ["rendezvous", "start", "detect", "stop", "rendezvous", "start"]


async def test_backoff_is_waited_between_restarts(tmp_path):
    agent = make_agent(
        tmp_path,
        sys.executable,
        ("-u", WORKER, "flaky", "--until-attempt", "2"),
        max_restarts=2,
        n=2,  # the stopped sibling's exit must not cut the backoff short
        restart_backoff=RestartBackoff(0.2, 1.0, 2.0, 0.0),
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await agent.run_async("trainer")
    assert result.state is WorkerState.SUCCEEDED
    assert loop.time() - started >= 0.2 + 0.4


async def test_request_stop_raises_agent_stopped(tmp_path):
    agent = make_agent(tmp_path, sys.executable, ("-u", WORKER, "sleep"), n=2)
    task = asyncio.ensure_future(agent.run_async("trainer"))
    async with asyncio.timeout(20):
        while agent.get_worker_group().state is not WorkerState.HEALTHY:
            await asyncio.sleep(0.01)
    pids = [w.id for w in agent.get_worker_group().workers]
    assert all(pids)
    agent.request_stop(signal.SIGTERM)
    with pytest.raises(AgentStopped) as info:
        await task
    assert info.value.exit_code == 128 + signal.SIGTERM
    assert agent.get_worker_group().state is WorkerState.STOPPED


async def test_cancelled_run_still_stops_workers(tmp_path):
    from tests.conftest import pid_alive

    agent = make_agent(
        tmp_path, sys.executable, ("-u", WORKER, "ignore-term"), n=1, stop_timeout=0.2
    )
    task = asyncio.ensure_future(agent.run_async("trainer"))
    async with asyncio.timeout(20):
        while agent.get_worker_group().state is not WorkerState.HEALTHY:
            await asyncio.sleep(0.01)
    pid = agent.get_worker_group().workers[0].id
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not pid_alive(pid)


async def test_illegal_state_change_is_rejected(tmp_path):
    agent = make_agent(tmp_path, "true")
    with pytest.raises(IllegalTransition):
        agent._set_state(WorkerState.SUCCEEDED, "test")


async def test_a_run_cancelled_twice_still_stops_its_workers_and_records_why(tmp_path, monkeypatch):
    """A second cancel while the agent shuts down (an outer timeout, a task group) must not
    cut the shutdown short: asyncio.shield would return at once, with workers alive."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("TEST_AGENTD_OUT", str(out))  # each worker notes it once it ignores TERM
    agent = make_agent(
        tmp_path, sys.executable, ("-u", WORKER, "ignore-term"), n=2, stop_timeout=0.5
    )  # stopping takes half a second: SIGTERM is ignored
    run = asyncio.create_task(agent.run_async("trainer"))
    async with asyncio.timeout(20):
        while len(agent.worker_processes()) < 2:
            await asyncio.sleep(0.01)
        while len(list(out.glob("pid_*"))) < 2:  # SIGTERM is ignored from here on
            await asyncio.sleep(0.01)
    pids = [p.pid for p in agent.worker_processes().values()]
    run.cancel()
    async with asyncio.timeout(20):  # the shutdown is under way, waiting for the stop timeout
        while agent.get_worker_group().state is not WorkerState.STOPPED:
            await asyncio.sleep(0.01)
    assert all(pid_alive(pid) for pid in pids)  # else the second cancel tests nothing
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not any(pid_alive(pid) for pid in pids)  # stopped before the cancel went on
    result = json.loads((tmp_path / "api-run" / "result.json").read_text())
    assert (result["state"], result["outcome"]) == ("STOPPED", "stopped")


async def test_a_hang_fails_the_group_with_its_report_through_the_python_api(tmp_path):
    """``LocalElasticAgent(settings=AgentSettings(heartbeats=...))``: a rank that stops
    heartbeating is found, dumped and reported; observers hear ``hang_detected``."""
    from agentd import AgentSettings, HeartbeatSettings
    from tests.conftest import TESTS

    job = str(TESTS / "workers" / "heartbeat_job.py")
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        entrypoint=sys.executable,
        args=("-u", job, "--steps", "40", "--hang-rank", "1", "--hang-at", "5"),
        rdzv_handler=StaticRendezvous("api-hang"),
        max_restarts=0,
    )
    hang_detection = AgentSettings(heartbeats=HeartbeatSettings(step_timeout=0.8))
    agent = LocalElasticAgent(spec, log_dir=tmp_path, settings=hang_detection)
    heard: list[dict] = []

    class Listener(AgentObserver):
        def hang_detected(self, details):
            heard.append(details)

    agent.add_observer(Listener())
    result = await agent.run_async("trainer")
    assert result.is_failed()
    root = result.root_cause
    assert root.global_rank == 1 and root.message.startswith("hang: rank 1 stopped first")
    assert root.hang is not None and root.hang["timeout_source"] == "explicit"
    assert [d["rank"] for d in heard] == [1]
    assert agent.heartbeat_status()["hangs"] == 1


def test_torchs_d_state_timeout_comes_from_its_argument_else_its_variable(tmp_path, monkeypatch):
    """As torch's agent: the argument wins, then TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT
    (a Python caller's agent ignored the variable); 0 or less is off, and a value that is
    not a number is an error naming the variable (torch turns the check off silently)."""
    from agentd.exceptions import ConfigError

    def stuck_after(*args: float) -> float:
        spec = WorkerSpec(role="t", local_world_size=1, entrypoint=sys.executable, args=("-c", ""))
        agent = LocalElasticAgent(spec, None, "spawn", 300, None, 7, None, *args, log_dir=tmp_path)
        assert agent._worker_group.spec.stop_timeout == 7  # shutdown_timeout
        watchdog = agent._settings.watchdog
        return watchdog.uninterruptible_timeout if watchdog is not None else 0.0

    monkeypatch.setenv("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "4.5")
    assert stuck_after(2.0) == 2.0
    assert stuck_after(-1.0) == 0.0
    from agentd.assembly.torch_env import watchdog_from_env

    assert watchdog_from_env().uninterruptible_timeout == 4.5
    monkeypatch.setenv("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "-3")
    assert watchdog_from_env().uninterruptible_timeout == 0.0
    monkeypatch.setenv("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT.*soon"):
        watchdog_from_env()
    with pytest.raises(ConfigError, match="shutdown_timeout"):
        spec = WorkerSpec(role="t", local_world_size=1, entrypoint=sys.executable, args=("-c", ""))
        LocalElasticAgent(spec, shutdown_timeout=-1, log_dir=tmp_path)
    with pytest.raises(ConfigError, match="shutdown_timeout: nan"):
        LocalElasticAgent(spec, shutdown_timeout=float("nan"), log_dir=tmp_path)
    with pytest.raises(ConfigError, match="exit_barrier_timeout: nan"):
        LocalElasticAgent(spec, exit_barrier_timeout=float("nan"), log_dir=tmp_path)
