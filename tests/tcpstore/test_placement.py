"""Where the workers' store is served when the user pins the master address."""

from __future__ import annotations

import sys

from agentd import LocalElasticAgent, WorkerSpec, WorkerState
from agentd.rendezvous.registry import RendezvousParameters, get_rendezvous_handler
from tests.conftest import free_port

CHECK = (
    "import os, sys; env = os.environ; "
    "sys.exit(0 if (env['MASTER_ADDR'], env['MASTER_PORT'], env['TORCHELASTIC_USE_AGENT_STORE'])"
    " == (sys.argv[1], '42', sys.argv[2]) else 3)"
)


def run_pinned(tmp_path, master_addr: str, agent_store: str) -> WorkerState:
    handler = get_rendezvous_handler(
        RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{free_port()}",
            run_id="pin",
            min_nodes=1,
            max_nodes=1,
        )
    )
    spec = WorkerSpec(
        role="t",
        local_world_size=1,
        entrypoint=sys.executable,
        args=("-c", CHECK, master_addr, agent_store),
        rdzv_handler=handler,
        master_addr=master_addr,
        master_port=42,
    )
    return LocalElasticAgent(spec, log_dir=str(tmp_path)).run().state


def test_a_master_address_elsewhere_is_the_users_store_not_the_agents(tmp_path):
    """The agent cannot serve at an address that is not this host's: rank 0's worker
    hosts the store there (it used to fail to start: 'cannot listen on test-host:42')."""
    assert run_pinned(tmp_path, "test-host.invalid", "False") is WorkerState.SUCCEEDED
