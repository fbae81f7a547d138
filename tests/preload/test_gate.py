"""A forked worker runs nothing of the user's before the agent knows its pid: it waits at
the gate until released, and a worker given up at the gate runs nothing at all."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentd.preload.client import Zygote
from agentd.preload.command import parse
from agentd.preload.forked import ZygoteWorker
from agentd.workers.output import StreamRoute
from agentd.workers.processes import group_alive

SCRIPT = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"


async def wait_for(predicate) -> None:
    async with asyncio.timeout(20.0):
        while not predicate():
            await asyncio.sleep(0.01)


def at_the_gate(pid: int, argv: list[str]) -> bool:
    """Set up and waiting: its command line is already the worker's (the last step of the
    set-up), and it sleeps."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return cmdline[: len(argv)] == [a.encode() for a in argv] and state == b"S"


async def fork_one(zygote: Zygote, tmp_path: Path, name: str) -> tuple[ZygoteWorker, Path]:
    marker = tmp_path / name
    argv = [sys.executable, "-u", str(tmp_path / "job.py"), str(marker)]
    worker = await zygote.fork(0, argv, {}, StreamRoute(), StreamRoute(), str(tmp_path))
    await wait_for(lambda: at_the_gate(worker.pid, argv))
    return worker, marker


async def test_a_forked_worker_runs_the_script_only_once_released(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    zygote = Zygote(parse([sys.executable, "-u", "job.py"]), [], {"PATH": "/usr/bin:/bin"})
    await zygote.start(str(tmp_path))
    try:
        worker, marker = await fork_one(zygote, tmp_path, "ran")
        assert worker.pgid == worker.pid and group_alive(worker.pgid)  # known, leads its group
        assert not marker.exists()  # held: the user's first line has not run
        worker.release()
        assert await asyncio.wait_for(worker.exited, 20) == 0
        assert marker.read_text() == str(worker.pid)

        given_up, marker = await fork_one(zygote, tmp_path, "never")
        given_up.abandon()  # the agent gives it up at the gate: it exits, having run nothing
        assert await asyncio.wait_for(given_up.exited, 20) == 127
        assert not marker.exists()
    finally:
        await zygote.stop()
