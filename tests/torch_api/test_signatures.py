"""Constructors, signatures and clocks, written as torch users write them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import warnings

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import elastic


def trainer() -> None:
    """A function entrypoint for specs built here."""


def static_handler(impl: str, run_id: str = "sig", port: int | None = None):
    rdzv = elastic(impl, "rendezvous")
    registry = elastic(impl, "rendezvous.registry")
    params = rdzv.RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{port or free_port()}",
        run_id=run_id,
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    return registry.get_rendezvous_handler(params)


def test_worker_spec_takes_torch_fields_in_torch_order(impl):
    server = elastic(impl, "agent.server")
    handler = static_handler(impl)
    spec = server.WorkerSpec("trainer", 2, handler, None, sys.executable, ("-c", "pass"))
    assert (spec.role, spec.local_world_size, spec.rdzv_handler) == ("trainer", 2, handler)
    assert spec.entrypoint == sys.executable and spec.args == ("-c", "pass")
    assert (spec.max_restarts, spec.monitor_interval) == (3, 0.1)
    assert (spec.master_port, spec.master_addr, spec.local_addr) == (None, None, None)


def test_worker_spec_takes_torchs_numa_options_keyword(impl):
    server = elastic(impl, "agent.server")
    spec = server.WorkerSpec(
        "trainer", 1, static_handler(impl), entrypoint=sys.executable, numa_options=None
    )
    assert spec.numa_options is None


def test_worker_spec_fn_is_deprecated_but_works(impl):
    server = elastic(impl, "agent.server")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = server.WorkerSpec(
            role="t", local_world_size=1, rdzv_handler=static_handler(impl), fn=trainer
        )
    assert spec.fn is trainer and caught  # torch warns that fn is deprecated


def one_worker_agent_parts(impl: str, tmp_path):
    """The agent module, the implementation's log specs, and a spec of one worker that
    exits 0."""
    server = elastic(impl, "agent.server")
    logs = elastic(impl, "multiprocessing").DefaultLogsSpecs(log_dir=str(tmp_path))
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=1,
        entrypoint=sys.executable,
        args=("-c", "pass"),
        rdzv_handler=static_handler(impl),
        max_restarts=0,
    )
    return elastic(impl, "agent.server.local_elastic_agent"), logs, spec


def test_local_elastic_agent_takes_torch_positional_arguments(impl, tmp_path):
    server = elastic(impl, "agent.server")
    local, logs, spec = one_worker_agent_parts(impl, tmp_path)
    agent = local.LocalElasticAgent(
        spec, logs, "spawn", 5, "[${rank}]:" if impl == "torch" else "[{rank}]:"
    )
    result = agent.run()
    assert result.state == server.WorkerState.SUCCEEDED
    assert not (tmp_path / "spawn").exists()  # "spawn" is the start method, not a directory


class CallersServer:
    """A health check server of the caller's: torch's agent stops it at its end."""

    stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_local_elastic_agent_takes_torchs_shutdown_health_and_d_state_arguments(impl, tmp_path):
    """torch 2.13's last three arguments, by keyword (agentd refused them: TypeError)."""
    server = elastic(impl, "agent.server")
    local, logs, spec = one_worker_agent_parts(impl, tmp_path)
    health = CallersServer()
    agent = local.LocalElasticAgent(
        spec,
        logs,
        shutdown_timeout=5,
        health_check_server=health,
        uninterruptible_state_timeout=2.5,
    )
    assert agent.run().state == server.WorkerState.SUCCEEDED
    assert health.stopped


def test_process_failure_reads_the_error_file_as_torch_does(impl, tmp_path):
    errors = elastic(impl, "multiprocessing.errors")
    path = tmp_path / "error.json"
    data = {
        "message": {
            "message": "RuntimeError: boom",
            "extraInfo": {"py_callstack": "Traceback: ...", "timestamp": "1700000000"},
        }
    }
    path.write_text(json.dumps(data))
    failure = errors.ProcessFailure(local_rank=1, pid=42, exitcode=1, error_file=str(path))
    assert failure.error_file_data == data
    # torch's message is the document's message object; agentd's is its text (README)
    assert "RuntimeError: boom" in str(failure.message)
    assert int(failure.timestamp) == 1700000000
    assert "SIG" not in failure.signal_name()  # an exit, not a signal (torch: "<N/A>")
    killed = errors.ProcessFailure(local_rank=0, pid=43, exitcode=-9, error_file="")
    assert killed.signal_name() == "SIGKILL"
    assert abs(killed.timestamp - time.time()) < 60


def test_expired_timers_are_found_on_the_clock_of_expiration_time(impl):
    """``get_expired_timers(deadline)`` takes ``time.time()`` seconds, the clock of
    ``TimerRequest.expiration_time``: a 100 s timer is not due now."""
    import multiprocessing as mp

    timer = elastic(impl, "timer")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = timer.LocalTimerServer(mp.get_context("spawn").Queue(), 60, True)
        server.register_timers([timer.TimerRequest(child.pid, "scope", time.time() + 100)])
        assert server.get_expired_timers(time.time()) == {}
        due = server.get_expired_timers(time.time() + 200)
        assert [r.scope_id for r in due[child.pid]] == ["scope"]
    finally:
        child.kill()
        child.wait()


def test_file_timer_server_signature_and_its_log_events(impl, tmp_path):
    timer = elastic(impl, "timer")
    events: list[str] = []
    server = timer.FileTimerServer(
        str(tmp_path / "timer.fifo"),
        "run-1",
        max_interval=0.1,
        daemon=True,
        log_event=lambda name, req: events.append(name),
    )
    server.start()  # returns at once; the server runs on a daemon thread
    # torch's server thread opens the pipe only once a client does, and fails if stop()
    # removed it first: use it as a worker would before stopping it.
    client = timer.FileTimerClient(str(tmp_path / "timer.fifo"))
    client.acquire("scope", time.time() + 600)
    client.release("scope")
    server.stop()
    assert events[0] == "watchdog started" and events[-1] == "watchdog stopped"


def test_health_check_server_starts_and_stops_synchronously(impl):
    health = elastic(impl, "agent.server.health_check_server")
    port = free_port()
    server = health.create_healthcheck_server(
        alive_callback=lambda: int(time.time()), port=port, timeout=60
    )
    server.start()
    try:
        if impl == "agentd":  # torch's open-source server is a stub that serves nothing
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as resp:
                assert resp.status == 200
    finally:
        server.stop()


@pytest.mark.parametrize("impl", ["agentd"])
def test_run_inside_a_running_loop_names_the_async_twin(impl):
    import asyncio

    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    spec = server.WorkerSpec(
        role="t", local_world_size=1, entrypoint=sys.executable, args=("-c", "pass")
    )
    agent = local.LocalElasticAgent(spec)

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"await agent\.run_async\(\)"):
            agent.run()
        result = await agent.run_async()
        assert result.state == server.WorkerState.SUCCEEDED

    asyncio.run(inside())


@pytest.mark.parametrize("impl", ["agentd"])
def test_a_run_without_rendezvous_gets_its_own_run_id(impl, tmp_path):
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    ids = []
    for _ in range(2):
        spec = server.WorkerSpec(
            role="t", local_world_size=1, entrypoint=sys.executable, args=("-c", "pass")
        )
        agent = local.LocalElasticAgent(spec, log_dir=tmp_path)
        assert agent.run().state == server.WorkerState.SUCCEEDED
        ids.append(agent.run_id)
    assert ids[0] != ids[1] and all((tmp_path / i / "result.json").exists() for i in ids)


@pytest.mark.parametrize("impl", ["agentd"])
def test_the_file_timer_and_health_port_come_from_torch_variables(impl, tmp_path, monkeypatch):
    """torch's LocalElasticAgent reads these itself; so does agentd's, built in Python."""
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    fifo, seen = tmp_path / "timer.fifo", tmp_path / "env.json"
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.setenv("TORCHELASTIC_TIMER_FILE", str(fifo))
    monkeypatch.setenv("TORCHELASTIC_HEALTH_CHECK_PORT", "0")
    script = (
        "import os, json, sys; json.dump({k: os.environ.get(k) for k in "
        "('TORCHELASTIC_TIMER_FILE', 'TORCHELASTIC_SIGNALS_TO_HANDLE')}, "
        "open(sys.argv[1], 'w'))"
    )
    spec = server.WorkerSpec(
        role="t",
        local_world_size=1,
        entrypoint=sys.executable,
        args=("-c", script, str(seen)),
        max_restarts=0,
    )
    agent = local.LocalElasticAgent(spec, log_dir=tmp_path)
    assert agent.run().state == server.WorkerState.SUCCEEDED
    assert agent.health_server is not None and agent.timer_server.path == str(fifo)
    env = json.loads(seen.read_text())
    assert env["TORCHELASTIC_TIMER_FILE"] == str(fifo)
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def test_the_agent_package_exports_the_file_timer_switches(impl):
    """``from torch.distributed.elastic.agent.server import TORCHELASTIC_TIMER_FILE``."""
    server = elastic(impl, "agent.server")
    assert server.TORCHELASTIC_ENABLE_FILE_TIMER == "TORCHELASTIC_ENABLE_FILE_TIMER"
    assert server.TORCHELASTIC_TIMER_FILE == "TORCHELASTIC_TIMER_FILE"


def test_the_store_utilities_export_what_torchs_do(impl):
    utils = elastic(impl, "utils.store")
    for name in ("barrier", "get_all", "store_timeout", "synchronize"):
        assert callable(getattr(utils, name)), name


def test_the_rendezvous_package_exports_what_a_site_registers_with(impl):
    """``from torch.distributed.elastic.rendezvous import RendezvousHandlerCreator``, to type
    the creator a site registers, and the store info a handler builds its answer from."""
    rdzv = elastic(impl, "rendezvous")
    assert "RendezvousHandlerCreator" in rdzv.__all__ and rdzv.RendezvousHandlerCreator
    assert rdzv.RendezvousStoreInfo("h", 1).master_port == 1


def test_a_static_handler_meets_at_its_endpoint(impl):
    """The endpoint of a static rendezvous is where the workers meet (torch's master), and
    the round's outcome reads as torch's ``RendezvousInfo`` does."""
    port = free_port()
    handler = static_handler(impl, "static", port)
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        store = info.bootstrap_store_info
        assert (store.master_addr, store.master_port) == ("127.0.0.1", port)
    finally:
        handler.shutdown()
