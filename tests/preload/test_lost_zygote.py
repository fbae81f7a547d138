"""A worker whose zygote dies while the agent waits for the zygote's report of its exit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from agentd.preload.client import Zygote
from agentd.preload.command import parse
from tests.preload.test_gate import fork_one


async def test_a_worker_that_exits_as_its_zygote_dies_still_reports_its_exit(tmp_path):
    """The worker's pidfd fires and the agent waits (2 s at most) for the zygote's report
    of its status; the zygote dies before it sends one. The waiter was cancelled with the
    zygote's channel and took the worker's exit with it: the agent never saw the worker
    go, and a job whose zygote was SIGKILLed waited with no worker (once in a suite run at
    ``-n 6``, ``test_zygote_killed_mid_job_restarts_with_a_new_zygote``). Its status is
    now read from its pidfd, as when the zygote was gone first."""
    (tmp_path / "job.py").write_text("")
    zygote = Zygote(parse([sys.executable, "-u", "job.py"]), [], {"PATH": "/usr/bin:/bin"})
    await zygote.start(str(tmp_path))
    try:
        worker, _ = await fork_one(zygote, tmp_path, "never")
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGSTOP)  # alive, but it reports nothing
        os.kill(worker.pid, signal.SIGKILL)
        async with asyncio.timeout(20):
            while not zygote._statuses:  # the pidfd fired: the agent waits for the report
                await asyncio.sleep(0.01)
        os.kill(zygote.pid, signal.SIGKILL)  # and the zygote dies before it reports
        assert await asyncio.wait_for(worker.exited, 20) == -signal.SIGKILL
    finally:
        await zygote.stop()
