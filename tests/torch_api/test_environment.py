"""torch's environment switches read by an agent built in Python."""

from __future__ import annotations

import socket
import sys

from tests.torch_api.conftest import elastic


def test_a_health_check_port_already_taken_does_not_stop_the_job(impl, tmp_path, monkeypatch):
    """A second agent on a host with the same ``TORCHELASTIC_HEALTH_CHECK_PORT``: torch's
    server does nothing; agentd's warns and runs without the endpoint."""
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    logs = elastic(impl, "multiprocessing").DefaultLogsSpecs(log_dir=str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv(local.TORCHELASTIC_HEALTH_CHECK_PORT, str(taken.getsockname()[1]))
        spec = server.WorkerSpec(
            role="trainer",
            local_world_size=1,
            entrypoint=sys.executable,
            args=("-c", "pass"),
            rdzv_handler=None,
        )
        if impl == "torch":  # torch's agent needs a handler; a static one of one node
            rdzv = elastic(impl, "rendezvous")
            registry = elastic(impl, "rendezvous.registry")
            from tests.conftest import free_port

            spec.rdzv_handler = registry.get_rendezvous_handler(
                rdzv.RendezvousParameters(
                    backend="static",
                    endpoint=f"127.0.0.1:{free_port()}",
                    run_id="hc",
                    min_nodes=1,
                    max_nodes=1,
                    rank=0,
                )
            )
        result = local.LocalElasticAgent(spec, logs).run()
    assert result.state == server.WorkerState.SUCCEEDED
