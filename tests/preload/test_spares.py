"""Spares: children the zygote forks ahead, so a restart's workers cost no fork. A worker
started from a spare is the one the agent was told of, runs only once released, and
behaves as a forked one; a dead spare is passed over; none outlives the zygote."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from agentd.preload.client import Zygote
from agentd.preload.command import parse
from agentd.workers.output import StreamRoute
from tests.conftest import pid_alive

SCRIPT = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nsys.exit(3)\n"


async def wait_for(predicate, what: str):
    async with asyncio.timeout(20.0):
        while not (value := predicate()):
            await asyncio.sleep(0.01)
    assert value, what
    return value


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


async def started_zygote(tmp_path: Path, spares: int, cuda: bool = False) -> Zygote:
    (tmp_path / "job.py").write_text(SCRIPT)
    zygote = Zygote(
        parse([sys.executable, "-u", "job.py"]),
        [],
        {"PATH": "/usr/bin:/bin"},
        spares=spares,
        cuda=cuda,
    )
    await zygote.start(str(tmp_path))
    await zygote.ready()
    return zygote


def slots(zygote: Zygote) -> dict[int, int]:
    """The spares held, by the slot each one's title in ``ps`` names."""
    title = re.compile(rf"agentd: standby worker (\d+) of zygote {zygote.pid}")
    return {int(title.fullmatch(cmdline(pid))[1]): pid for pid in zygote.spare_pids}


async def run_one(zygote: Zygote, tmp_path: Path, name: str, local_rank: int = 0):
    marker = tmp_path / name
    argv = [sys.executable, "-u", str(tmp_path / "job.py"), str(marker)]
    routes = (StreamRoute(), StreamRoute())
    worker = await zygote.fork(local_rank, argv, {}, *routes, str(tmp_path))
    assert not marker.exists()  # held at the gate until released
    worker.release()
    assert await asyncio.wait_for(worker.exited, 20) == 3
    assert marker.read_text() == str(worker.pid)
    return worker


async def test_a_fork_takes_its_slots_spare_and_the_zygote_forks_another(tmp_path):
    zygote = await started_zygote(tmp_path, spares=2)
    try:
        spares = await wait_for(lambda: len(zygote.spare_pids) == 2 and zygote.spare_pids, "2")
        for pid in spares:  # each one leads its group and says what it is in ps
            assert os.getpgid(pid) == pid and os.getsid(pid) == pid
        held = slots(zygote)
        assert sorted(held) == [0, 1]
        worker = await run_one(zygote, tmp_path, "first", local_rank=1)
        assert worker.pid == held[1]  # the agent knew its pid before it ran a line
        assert worker.pgid == worker.pid
        refilled = await wait_for(lambda: len(zygote.spare_pids) == 2 and slots(zygote), "")
        assert refilled[0] == held[0] and refilled[1] not in held.values()  # slot 1 again
        other = await run_one(zygote, tmp_path, "second", local_rank=7)  # no slot 7: any
        assert other.pid in refilled.values()
    finally:
        await zygote.stop()


async def test_with_cuda_a_spare_takes_only_its_own_slots_rank(tmp_path):
    """A standby that made a context on its slot's device is never handed another local
    rank (its worker would hold a context on a device not its own): that rank is forked.
    Here torch is not preloaded, so the standbys skip CUDA, but the rule is the same."""
    zygote = await started_zygote(tmp_path, spares=2, cuda=True)
    try:
        held = await wait_for(lambda: len(zygote.spare_pids) == 2 and slots(zygote), "2")
        worker = await run_one(zygote, tmp_path, "rank2", local_rank=2)
        assert worker.pid not in held.values()
        assert slots(zygote) == held  # both still stand by
        worker = await run_one(zygote, tmp_path, "rank0", local_rank=0)
        assert worker.pid == held[0]
    finally:
        await zygote.stop()


async def test_dead_spares_are_passed_over(tmp_path):
    zygote = await started_zygote(tmp_path, spares=2)
    try:
        spares = await wait_for(lambda: len(zygote.spare_pids) == 2 and zygote.spare_pids, "2")
        for pid in spares:
            os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: not any(pid_alive(pid) for pid in spares), "the spares dead")
        worker = await run_one(zygote, tmp_path, "after")  # from a fresh fork or spare
        assert worker.pid not in spares
    finally:
        await zygote.stop()


async def test_no_spare_outlives_the_zygote(tmp_path):
    zygote = await started_zygote(tmp_path, spares=3)
    spares = await wait_for(lambda: len(zygote.spare_pids) == 3 and zygote.spare_pids, "3")
    await zygote.stop()
    assert not any(pid_alive(pid) for pid in [zygote.pid, *spares])
