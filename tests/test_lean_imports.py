"""What each entry point loads: heavy libraries only where their feature is used.

The agent's start path (and its RSS) must not pay for aiohttp, prometheus_client or psutil
unless the health endpoint is on; a worker using timers must not pay for asyncio.
"""

from __future__ import annotations

import ast
import subprocess
import sys

PROBE = "import sys; {imports}; print(sorted(m for m in {heavy!r} if m in sys.modules))"


def loaded(imports: str, heavy: tuple[str, ...]) -> list[str]:
    code = PROBE.format(imports=imports, heavy=heavy)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    return ast.literal_eval(out.stdout)  # a printed list of names


def test_agent_start_path_without_health_is_lean():
    imports = "import agentd.cli, agentd.agent.local, agentd.health.server, agentd.timer.server"
    assert loaded(imports, ("aiohttp", "prometheus_client", "psutil", "torch")) == []


def test_worker_side_timer_client_needs_no_asyncio():
    imports = (
        "from agentd.timer import expires, FileTimerClient, configure; "
        "import agentd.reports.failure"
    )
    assert loaded(imports, ("asyncio", "aiohttp", "torch")) == []


def test_worker_side_heartbeats_need_no_asyncio():
    imports = ("import agentd; agentd.heartbeat(); agentd.section('x').__enter__(); "
               "agentd.end_heartbeats()")  # fmt: skip
    assert loaded(imports, ("asyncio", "aiohttp", "torch", "prometheus_client")) == []
