"""The agent's metrics and events reach a site's handlers as under torch."""

from __future__ import annotations

import urllib.request

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import RUNS_SCRIPTS, elastic, run_script

pytestmark = RUNS_SCRIPTS


def test_a_successful_run_publishes_torchs_metrics_and_worker_events(impl):
    out = run_script(impl, "metrics_events.py", "ok", str(free_port()))
    assert out["state"] == "SUCCEEDED"
    seen = out["metrics"]
    assert seen["workers.trainer.run_total"] == 1
    assert seen["workers.trainer.run_success_no_retries"] == 1
    assert seen["workers.trainer.run_failed_no_retries"] == 0
    assert seen["workers.trainer.run_success_with_retries"] == 0
    assert out["events"].count("torchelastic.worker.status.SUCCEEDED") == 2
    assert out["events"][-1] == "torchelastic.worker.status.TIMED"  # record_duration's


def test_a_failed_run_says_so_in_metrics_and_events(impl):
    out = run_script(impl, "metrics_events.py", "fail", str(free_port()))
    assert out["state"] == "FAILED"
    assert out["metrics"]["workers.trainer.run_failed_no_retries"] == 1
    assert out["metrics"]["workers.trainer.flakiness"] == 100
    assert "torchelastic.worker.status.FAILED" in out["events"]


@pytest.mark.parametrize("impl", ["agentd"])
def test_put_metric_values_show_on_the_agents_metrics_endpoint(impl, tmp_path):
    """The README's promise: a value given to put_metric in the agent's process is on
    /metrics while the agent runs (torch has no such endpoint)."""
    import sys
    import threading

    metrics = elastic(impl, "metrics")
    server = elastic(impl, "agent.server")
    from agentd import AgentSettings
    from agentd.agent.local import LocalElasticAgent
    from agentd.health.settings import HealthSettings

    spec = server.WorkerSpec(
        role="t",
        local_world_size=1,
        entrypoint=sys.executable,
        args=("-c", "import time; time.sleep(30)"),
        max_restarts=0,
    )
    health = AgentSettings(health=HealthSettings(port=0))
    agent = LocalElasticAgent(spec, log_dir=tmp_path, settings=health)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            agent.run()
        except BaseException as exc:  # the stop below ends the run with AgentStopped
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        from tests.conftest import wait_until

        wait_until(lambda: agent.health_server is not None and agent.health_server.port, 30)
        metrics.put_metric("batches", 42, "mytrainer")
        url = f"http://127.0.0.1:{agent.health_server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        assert 'agentd_custom_metric{group="mytrainer",name="batches"} 42.0' in text
    finally:
        agent.request_stop()  # from this thread: the run's loop gets it
        runner.join(30)
    assert not runner.is_alive() and type(outcome[0]).__name__ == "AgentStopped"
