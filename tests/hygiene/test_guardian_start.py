"""An agent killed in the moments after its guardian's spawn: the guardian still knows what
it was told before, because that is in its pipe before it runs. Before, the lines were
written once the spawn returned, so an agent killed in between left its pipe directory
(seen once in CI: ``tests/integration/test_stopping.py::test_kill_9_leaves_nothing_behind``)
and its token files to nobody.

The agent here is a small program that guards a pipe directory and a token file as agentd
does (:class:`~agentd.hygiene.service.ProcessHygiene`), and SIGKILLs itself the moment
the guardian's spawn returns."""

from __future__ import annotations

import os
import subprocess
import sys

from agentd.store import token_file
from tests.conftest import pid_alive, wait_until

AGENT = """
import asyncio, os, signal, sys
from agentd.hygiene.service import ProcessHygiene
from agentd.store import token_file

spawn = asyncio.create_subprocess_exec

async def spawn_then_die(*args, **kwargs):
    guardian = await spawn(*args, **kwargs)
    print(guardian.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

async def main(pipe_dir):
    hygiene = ProcessHygiene("start-test-%d" % os.getpid(), "run", enabled=True, fresh_run_id=True)
    await hygiene.start()
    token_file.publish(4, "killed")
    hygiene.remove_when_gone(pipe_dir)
    asyncio.create_subprocess_exec = spawn_then_die
    await hygiene.started([])

asyncio.run(main(sys.argv[1]))
"""


def test_an_agent_killed_as_its_guardian_starts_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    pipe_dir = tmp_path / "agentd-timer-start-test"
    pipe_dir.mkdir(mode=0o700)
    os.mkfifo(pipe_dir / "timer.fifo", 0o600)
    agent = subprocess.run(
        [sys.executable, "-c", AGENT, str(pipe_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert agent.returncode == -9, agent.stderr
    guardian = int(agent.stdout)
    wait_until(lambda: not pid_alive(guardian), what="the guardian to act and exit")
    assert not pipe_dir.exists()
    assert not token_file.token_path(4).exists()
