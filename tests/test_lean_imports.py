"""What each entry point loads: heavy libraries only where their feature is used.

The agent's start path (and its RSS) must not pay for aiohttp, prometheus_client or psutil
unless the health endpoint is on; a worker using timers must not pay for asyncio.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import WORKER

PROBE = "import sys; {imports}; print(sorted(m for m in {heavy!r} if m in sys.modules))"


def loaded(imports: str, heavy: tuple[str, ...]) -> list[str]:
    code = PROBE.format(imports=imports, heavy=heavy)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return ast.literal_eval(out.stdout)  # a printed list of names


def test_agent_start_path_without_health_is_lean():
    imports = "import agentd.cli, agentd.agent.local, agentd.health.server, agentd.timer.server"
    assert loaded(imports, ("aiohttp", "prometheus_client", "psutil", "torch")) == []


def test_a_multi_node_agents_store_and_client_need_no_aiohttp():
    """The embedded store and its client speak HTTP themselves (support/json_http.py,
    support/json_client.py): a multi-node agent, hosting the store or not, loads none of
    aiohttp's client or server (the health endpoint and etcd may)."""
    imports = (
        "import agentd.store.server, agentd.store.http_client, agentd.store.failover, "
        "agentd.store.connect, agentd.rendezvous.build, agentd.rendezvous.dynamic"
    )
    assert loaded(imports, ("aiohttp", "yarl", "multidict")) == []


def test_probing_the_store_candidates_needs_no_aiohttp():
    """A failover asks every candidate its role (store/candidates.py), on the same lean
    client: here one that refuses, and one that is this process's own listener."""
    imports = (
        "import asyncio, socket; from agentd.store.candidates import Prober; "
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "p = Prober(['127.0.0.1:9', f'127.0.0.1:{s.getsockname()[1]}'], 't', timeout=0.5); "
        "r = asyncio.run(p.roles(1)); assert all(x.problem for x in r), r"
    )
    assert loaded(imports, ("aiohttp", "yarl", "multidict")) == []


def test_worker_side_timer_client_needs_no_asyncio():
    imports = (
        "from agentd.timer import expires, FileTimerClient, configure; import agentd.errors.record"
    )
    assert loaded(imports, ("asyncio", "aiohttp", "torch")) == []


def test_worker_side_heartbeats_need_no_asyncio():
    imports = (
        "import agentd; agentd.heartbeat(); agentd.section('x').__enter__(); "
        "agentd.end_heartbeats()"
    )
    assert loaded(imports, ("asyncio", "aiohttp", "torch", "prometheus_client")) == []


NOT_FOR_A_PLAIN_JOB = (
    "anyio",
    "aiohttp",
    "prometheus_client",
    "psutil",
    "random",
    "shutil",
    "statistics",
    "tempfile",
    "agentd.health.settings",
    "agentd.health.server",
    "agentd.support.http_site",
    "agentd.heartbeats.hang_watch",
    "agentd.heartbeats.monitor",
    "agentd.heartbeats.stacks",
    "agentd.heartbeats.stragglers",
    "agentd.preload.client",
    "agentd.rendezvous.registry",
    "agentd.rendezvous.foreign",
)
"""What a standalone job that asked for no health port, no preload and no event log, whose
workers never heartbeat, must never import: each is the cost of a feature it did not use."""


def test_a_standalone_job_imports_only_what_it_uses(tmp_path):
    argv = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path),
        WORKER,
        "ok",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "agentd.agent.local" in imported  # the probe works
    assert sorted(imported & set(NOT_FOR_A_PLAIN_JOB)) == []


def test_the_heartbeat_engine_loads_at_the_first_heartbeat(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("import agentd\nfor _ in range(3):\n    agentd.heartbeat()\n")
    argv = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--log-dir",
        str(tmp_path),
        str(job),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "agentd.heartbeats.hang_watch" in imported
