"""A zygote that dies or stops answering while the agent waits on it: its workers' exits,
its forks and its preload."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from agentd.preload import liveness
from agentd.preload.client import Zygote
from agentd.preload.command import parse
from agentd.preload.liveness import ZygoteUnresponsive
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


async def test_a_worker_whose_zygote_is_stopped_exits_with_its_own_status(tmp_path):
    """bench/bench_chaos.py seed 1 (2026-12-03): the zygote was stopped (SIGSTOP) while
    its workers trained; they ended their job, and each exit was taken as SIGKILL 2 s
    later (the status sat in the zombie the stopped zygote could not reap), so a job that
    succeeded failed. The status is now read from the zombie."""
    (tmp_path / "job.py").write_text("import sys\nsys.exit(3)\n")
    zygote = Zygote(parse([sys.executable, "-u", "job.py"]), [], {"PATH": "/usr/bin:/bin"})
    await zygote.start(str(tmp_path))
    try:
        worker, _ = await fork_one(zygote, tmp_path, "unused")
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGSTOP)
        worker.release()
        assert await asyncio.wait_for(worker.exited, 20) == 3
    finally:
        if zygote.pid is not None:
            os.kill(zygote.pid, signal.SIGCONT)
        await zygote.stop()


async def test_a_fork_a_stopped_zygote_leaves_unanswered_is_an_error_naming_its_state(
    tmp_path, monkeypatch
):
    """The same seeds 0 and 3: the next attempt's fork asked of the stopped zygote waited
    for its answer for ever, and the agent said nothing more after its rendezvous."""
    monkeypatch.setattr(liveness, "FORK_ANSWER", 0.5)
    (tmp_path / "job.py").write_text("")
    zygote = Zygote(parse([sys.executable, "-u", "job.py"]), [], {"PATH": "/usr/bin:/bin"})
    await zygote.start(str(tmp_path))
    try:
        await zygote.ready()
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGSTOP)
        with pytest.raises(
            ZygoteUnresponsive, match=r"did not answer a fork in 0.5s \(it is stopped\)"
        ):
            await fork_one(zygote, tmp_path, "never")
        assert not zygote.answering
        await zygote.kill()
        assert not zygote.alive and zygote._process.returncode == -signal.SIGKILL
    finally:
        await zygote.stop()


async def test_a_zygote_stopped_during_its_preload_is_unresponsive(tmp_path, monkeypatch):
    """bench/bench_chaos.py seed 24: a zygote started to replace a lost one was stopped
    as it preloaded torch, and the agent waited for its preload for ever (a preload may
    take long, so only a zygote that stays stopped is given up)."""
    monkeypatch.setattr(liveness, "STOPPED_GRACE", 0.5)
    (tmp_path / "job.py").write_text("")
    zygote = Zygote(parse([sys.executable, "-u", "job.py"]), [], {"PATH": "/usr/bin:/bin"})
    await zygote.start(str(tmp_path))
    try:
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGSTOP)  # long before its interpreter is up
        with pytest.raises(ZygoteUnresponsive, match=r"stopped for 0.5s during its preload"):
            await zygote.ready()
        assert not zygote.answering
    finally:
        await zygote.kill()
