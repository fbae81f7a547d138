"""Rendezvous handlers built in Python, a torch handler object driving agentd's agent, and
function entrypoints that cannot be spawned."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import RUNS_SCRIPTS, elastic, run_script

pytestmark = RUNS_SCRIPTS

CHECK_RANK = "import os, sys; sys.exit(0 if os.environ['RANK'] in ('0', '1') else 5)"


def test_a_c10d_handler_from_rendezvous_parameters_runs_a_job(impl, tmp_path):
    rdzv, registry = elastic(impl, "rendezvous"), elastic(impl, "rendezvous.registry")
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    params = rdzv.RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="c10d-py",
        min_nodes=1,
        max_nodes=1,
    )
    handler = registry.get_rendezvous_handler(params)
    assert handler.get_run_id() == "c10d-py"
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=handler,
        entrypoint=sys.executable,
        args=("-c", CHECK_RANK),
        max_restarts=0,
    )
    logs = elastic(impl, "multiprocessing").DefaultLogsSpecs(log_dir=str(tmp_path))
    result = local.LocalElasticAgent(spec, logs).run()
    assert result.state == server.WorkerState.SUCCEEDED


def test_an_unknown_backend_is_a_clear_error(impl):
    rdzv, registry = elastic(impl, "rendezvous"), elastic(impl, "rendezvous.registry")
    params = rdzv.RendezvousParameters(
        backend="nope", endpoint="127.0.0.1:1", run_id="x", min_nodes=1, max_nodes=1
    )
    with pytest.raises((ValueError, RuntimeError), match="nope"):
        registry.get_rendezvous_handler(params)


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_settings_a_backend_does_not_use_are_ignored(impl, backend):
    """torch's launcher adds ``timeout`` and its tests ``is_host`` whatever the backend."""
    rdzv, registry = elastic(impl, "rendezvous"), elastic(impl, "rendezvous.registry")
    params = rdzv.RendezvousParameters(
        backend=backend,
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="extra",
        min_nodes=1,
        max_nodes=1,
        rank=0,
        timeout=60,
        is_host=True,
        something_else="x",
    )
    handler = registry.get_rendezvous_handler(params)
    assert handler.get_run_id() == "extra"
    handler.shutdown()


@pytest.mark.torch
def test_a_torch_rendezvous_handler_drives_agentds_agent(tmp_path):
    """A site's own handler (here torch's static one: synchronous methods) keeps working."""
    torch_rdzv = pytest.importorskip("torch.distributed.elastic.rendezvous")
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from agentd.elastic.agent.server import WorkerSpec, WorkerState
    from agentd.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    params = torch_rdzv.RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="foreign",
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=sys.executable,
        args=("-c", CHECK_RANK),
        max_restarts=0,
    )
    agent = LocalElasticAgent(spec, log_dir=tmp_path)
    assert agent.run().state == WorkerState.SUCCEEDED
    assert agent.run_id == "foreign"


AGENT_STORE_AT = (
    "import os, sys; env = os.environ; sys.exit(0 if (env['TORCHELASTIC_USE_AGENT_STORE'], "
    "env['MASTER_PORT'], env['TORCHELASTIC_RUN_ID']) == ('True', sys.argv[1], 'direct') else 5)"
)


def test_a_static_tcp_rendezvous_built_directly_runs_a_job(impl, tmp_path):
    """torch's constructor (master address and port, node rank, number of nodes, run id,
    timeout); the agent serves the workers' store at that port. agentd's class used to be
    its own static rendezvous, with another signature."""
    static_tcp = elastic(impl, "rendezvous.static_tcp_rendezvous")
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    port = free_port()
    handler = static_tcp.StaticTCPRendezvous("127.0.0.1", port, 0, 1, "direct", 60)
    assert (handler.get_backend(), handler.get_run_id()) == ("static", "direct")
    assert handler.use_agent_store and (handler.rank, handler.world_size) == (0, 1)
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=handler,
        entrypoint=sys.executable,
        args=("-c", AGENT_STORE_AT, str(port)),
        max_restarts=0,
    )
    logs = elastic(impl, "multiprocessing").DefaultLogsSpecs(log_dir=str(tmp_path))
    assert local.LocalElasticAgent(spec, logs).run().state == server.WorkerState.SUCCEEDED
    assert handler.shutdown() is True


@pytest.mark.parametrize("impl", ["agentd"])
def test_a_lambda_entrypoint_is_a_clear_error(impl):
    """torch fails later, in the worker's spawn; agentd says so when the spec is built."""
    server = elastic(impl, "agent.server")
    with pytest.raises(ValueError, match=r"entrypoint: .*<lambda>.*top level of a module"):
        server.WorkerSpec(role="t", local_world_size=1, entrypoint=lambda: None)


@pytest.mark.parametrize("impl", ["agentd"])
def test_a_worker_that_cannot_load_its_function_names_the_error(impl):
    """The launching script breaks when re-imported in the worker: the root cause is that
    error (torch reports only the exit code)."""
    out = run_script(impl, "unloadable.py")
    assert out["state"] == "FAILED"
    assert "RuntimeError: this module refuses to load in a worker" in out["message"]


class _BytesStore:
    """The two calls of a c10d store ``RendezvousStoreInfo.build`` makes."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key]


def test_rendezvous_store_info_build_gives_every_rank_rank_0s_address(impl):
    api = elastic(impl, "rendezvous.api")
    info = api.RendezvousStoreInfo
    store = _BytesStore()
    first = info.build(0, store, "10.0.0.1", server_port=29500)
    other = info.build(1, store, "10.0.0.2")
    assert first == other == info("10.0.0.1", 29500)
    assert store.data == {info.MASTER_ADDR_KEY: b"10.0.0.1", info.MASTER_PORT_KEY: b"29500"}
    picked = info.build(0, _BytesStore(), None)  # no address, no shared port: found
    assert picked.master_addr == socket.getfqdn() and 0 < picked.master_port < 65536
