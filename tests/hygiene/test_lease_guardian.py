"""No worker runs unguarded while its agent holds a lease: the first lease starts the
guardian, and workers spawn only once it runs and holds the lease. Started after the first
workers, as it once was, it left a window in which an agent frozen (SIGSTOP, a stalled VM)
had workers nobody would fence: they outlived the lease on their ranks, beside the round the
others formed over those ranks (tests/chaos/test_freezes.py caught it in the suite on a
loaded machine, 2026-11-29)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from agentd.hygiene.guardian_process import LEASE_SLACK
from agentd.hygiene.service import ProcessHygiene
from agentd.workers.output import StreamRoute
from agentd.workers.processes import spawn_worker

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_a_worker_spawned_under_a_lease_is_fenced_though_its_agent_never_says_more():
    hygiene = ProcessHygiene("lease-test", "run", enabled=True, fresh_run_id=True)
    worker = None
    try:
        lease_end = time.monotonic() + 1.0
        hygiene.on_lease(lease_end)  # the membership's first heartbeat, during the rendezvous
        await hygiene.guarding()  # the agent's last step before it spawns workers
        with hygiene.spawning():
            worker = await spawn_worker(0, SLEEPER, os.environ, StreamRoute(), StreamRoute())
            hygiene.adopt([worker])
        # the agent is frozen here: no started(), no renewal; the guardian alone acts
        async with asyncio.timeout(lease_end - time.monotonic() + LEASE_SLACK + 20):
            code = await worker.exited
        assert code == -signal.SIGKILL
        assert time.monotonic() >= lease_end  # at the lease's end, not before
    finally:
        if worker is not None and worker.returncode is None:
            os.killpg(worker.pgid, signal.SIGKILL)
            await worker.exited
        if worker is not None:
            await worker.drain()
        await hygiene.stop()


async def test_without_a_lease_the_guardian_waits_for_the_first_workers():
    """A standalone job has no lease: nothing to fence, and its first workers are not
    delayed by the guardian's start (it starts once they are spawned)."""
    hygiene = ProcessHygiene("lease-test", "run", enabled=True, fresh_run_id=True)
    try:
        await hygiene.guarding()
        assert hygiene._guardian is None
        await hygiene.started([])
        assert hygiene._guardian is not None and hygiene._guardian.pid is not None
    finally:
        await hygiene.stop()
