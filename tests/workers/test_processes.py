"""The stop policy and exit detection, on real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agentd.workers.output import StreamRoute
from agentd.workers.processes import WorkerProcess, spawn_worker, stop_workers
from tests.conftest import pid_alive

PY = sys.executable


async def spawn(code: str, *, capture: bool = True) -> WorkerProcess:
    route = StreamRoute(keep_tail=True) if capture else StreamRoute()
    return await spawn_worker(0, [PY, "-c", code], os.environ, route, route)


async def wait_line(worker: WorkerProcess, text: str) -> None:
    async with asyncio.timeout(20):
        while text not in worker.sinks[2].tail():
            await asyncio.sleep(0.01)


async def spawn_ignoring_sigterm() -> WorkerProcess:
    code = (
        "import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ready', file=sys.stderr, flush=True); time.sleep(60)"
    )
    worker = await spawn(code)
    await wait_line(worker, "ready")
    return worker


async def test_exit_code_and_time_are_recorded():
    worker = await spawn("import sys; sys.exit(7)")
    async with asyncio.timeout(20):
        assert await worker.exited == 7
    assert worker.returncode == 7 and worker.exited_at >= worker.started_at
    await worker.drain()


async def test_worker_leads_its_own_process_group_and_session():
    worker = await spawn(
        "import sys,time; print('ready', file=sys.stderr, flush=True); time.sleep(60)"
    )
    await wait_line(worker, "ready")
    assert os.getpgid(worker.pid) == worker.pid
    assert os.getsid(worker.pid) == worker.pid
    await stop_workers([worker], stop_timeout=5)
    assert worker.returncode == -signal.SIGTERM


async def test_exit_seen_while_grandchild_holds_pipes():
    mark = f"{os.getpid()}.0/test-{time.monotonic_ns()}"
    code = (
        "import subprocess,sys; p = subprocess.Popen(['sleep','60'], start_new_session=True);"
        "print(p.pid, file=sys.stderr, flush=True); sys.exit(4)"
    )
    route = StreamRoute(keep_tail=True)
    env = {**os.environ, "AGENTD_OWNER": mark}
    worker = await spawn_worker(0, [PY, "-c", code], env, route, route)
    async with asyncio.timeout(5):
        assert await worker.exited == 4
    assert not worker.pipes_closed.done()  # the pipe is still held, yet the exit was seen
    escaped = int(worker.sinks[2].tail().strip())
    assert pid_alive(escaped)
    strays = await stop_workers([worker], stop_timeout=5, mark=mark)
    assert strays == [escaped]  # it left the group, but carried the mark
    assert worker.pipes_closed.done()


async def test_stop_escalates_to_sigkill_after_timeout():
    worker = await spawn_ignoring_sigterm()
    started = time.monotonic()
    await stop_workers([worker], stop_timeout=0.3)
    assert worker.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 0.3


async def test_a_stopped_worker_gets_its_stop_signal_at_once():
    """A stopped process (SIGSTOP) holds SIGTERM pending until it runs again: the stop
    follows it with SIGCONT (systemd's order), where it used to wait out its timeout."""
    worker = await spawn(
        "import sys,time; print('ready', file=sys.stderr, flush=True); time.sleep(60)"
    )
    await wait_line(worker, "ready")
    os.kill(worker.pid, signal.SIGSTOP)
    async with asyncio.timeout(20):
        while Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            await asyncio.sleep(0.01)
    await stop_workers([worker], stop_timeout=60)
    assert worker.returncode == -signal.SIGTERM


async def test_force_cuts_the_grace_period():
    worker = await spawn_ignoring_sigterm()
    force = asyncio.Event()
    stopping = asyncio.ensure_future(stop_workers([worker], stop_timeout=600, force=force))
    await asyncio.sleep(0)
    force.set()
    async with asyncio.timeout(10):
        await stopping
    assert worker.returncode == -signal.SIGKILL


async def test_children_of_an_exited_leader_are_killed():
    code = (
        "import subprocess,sys; p = subprocess.Popen(['sleep','60']);"
        "print(p.pid, file=sys.stderr, flush=True)"
    )
    worker = await spawn(code)
    async with asyncio.timeout(20):
        assert await worker.exited == 0
    async with asyncio.timeout(20):
        while not worker.sinks[2].tail().strip():
            await asyncio.sleep(0.01)
    grandchild = int(worker.sinks[2].tail().strip())
    assert pid_alive(grandchild)
    await stop_workers([worker], stop_timeout=5)
    assert not pid_alive(grandchild)


async def test_cancelled_stop_still_kills_and_reaps():
    worker = await spawn_ignoring_sigterm()
    task = asyncio.ensure_future(stop_workers([worker], stop_timeout=600))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10):
        assert await worker.exited == -signal.SIGKILL
    await worker.drain()


async def test_missing_executable_is_a_start_error():
    from agentd.exceptions import StartError

    with pytest.raises(StartError, match="could not start worker 0: /no/such/binary"):
        await spawn_worker(0, ["/no/such/binary"], os.environ, StreamRoute(), StreamRoute())


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ watches children by pidfd")
async def test_children_are_watched_by_pidfd_and_a_replaced_watcher_is_put_back():
    import warnings

    from agentd.support.aio import use_pidfd_child_watcher

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        use_pidfd_child_watcher()
        ours = asyncio.get_child_watcher()
        assert isinstance(ours, asyncio.PidfdChildWatcher)
        use_pidfd_child_watcher()
        assert asyncio.get_child_watcher() is ours  # kept, not replaced at every spawn
        asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())
        use_pidfd_child_watcher()  # as every agentd test leaves it
        assert isinstance(asyncio.get_child_watcher(), asyncio.PidfdChildWatcher)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
