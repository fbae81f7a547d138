"""Strays (processes that left their worker's group) are found among the agent's own
descendants when it is a child subreaper, rather than by reading every process on the
host: a stop kills them all the same."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from agentd.hygiene.guardian_process import descendants
from tests.conftest import pid_alive, wait_until

# A subreaper with a worker whose child left the group (setsid) before the worker exited:
# the stray re-parents to the subreaper, is one of its descendants, and the stop kills it.
SUBREAPER = """
import asyncio, json, os, sys
from agentd.hygiene import orphans
from agentd.workers.output import StreamRoute
from agentd.workers.processes import spawn_worker, stop_workers

async def main():
    assert orphans.become_subreaper() and orphans.is_subreaper()
    mark = sys.argv[1]
    code = ("import subprocess,sys; p = subprocess.Popen(['sleep','60'], start_new_session=True);"
            "print(p.pid, file=sys.stderr, flush=True)")
    route = StreamRoute(keep_tail=True)
    env = {**os.environ, "AGENTD_OWNER": mark}
    worker = await spawn_worker(0, [sys.executable, "-c", code], env, route, route)
    await worker.exited
    escaped = int(worker.sinks[2].tail().strip())
    found = orphans.our_descendants()
    strays = await stop_workers([worker], stop_timeout=5, mark=mark)
    print(json.dumps({"escaped": escaped, "found": found, "strays": strays}))

asyncio.run(main())
"""


def test_a_subreaper_finds_and_kills_a_stray_among_its_descendants():
    mark = f"{os.getpid()}.0/test-{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-c", SUBREAPER, mark], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["escaped"] in report["found"]  # re-parented to the subreaper
    assert report["strays"] == [report["escaped"]]
    wait_until(lambda: not pid_alive(report["escaped"]), what="the stray gone")


def test_descendants_go_down_every_generation():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '60'])"],
        start_new_session=True,
    )
    grandchildren: list[int] = []
    try:

        def grandchild() -> list[int]:
            found = descendants(os.getpid()) or []
            with contextlib.suppress(ProcessLookupError):
                return [p for p in found if p != child.pid and os.getpgid(p) == child.pid]
            return []

        grandchildren = wait_until(grandchild, what="the grandchild")
        assert child.pid in (descendants(os.getpid()) or [])
    finally:
        for pid in [child.pid, *grandchildren]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
