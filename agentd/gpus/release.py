"""After the agent stops workers, wait until their GPU memory is released, or is not
needed: until none of them holds memory on the node's GPUs, or what they hold fits in
what those GPUs have free.

A process's GPU memory is freed as it exits, but not at once: the driver tears its
context down (0.1-1 s), and a process of the worker's tree that the stop did not wait
for may still hold some. New workers started on a nearly full GPU meanwhile die of CUDA
out of memory; on a GPU with as much free as the stopped workers still hold there they
do not, and need not wait for the teardown. :class:`GpuRelease` reads the holders and the
free memory (:mod:`agentd.gpus.usage`) in the background from the stop, while the next
round forms, until either holds, bounded; the next start waits for it
(:meth:`GpuRelease.settled`). It logs what is still held and by which pid, and never
fails the restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentd.gpus import may_have_gpus

if TYPE_CHECKING:
    from agentd.gpus.usage import GpuUsage
    from agentd.view import Helpers

log = logging.getLogger(__name__)

FIRST_INTERVAL = 0.05
MAX_INTERVAL = 0.5


class GpuRelease:
    """Waits up to ``timeout`` seconds after a stop for the stopped processes' GPU memory
    (0: never waits). The GPUs are looked for once: by :meth:`look`, or at the first
    stop. ``helpers``: the agent's process hygiene, which runs nvidia-smi's readings."""

    def __init__(self, timeout: float, helpers: Helpers | None = None) -> None:
        self.timeout = timeout
        self._helpers = helpers
        self._usage: GpuUsage | None = None
        self._looked = False
        self._looking: asyncio.Future[GpuUsage | None] | None = None
        self._waits: list[asyncio.Task[None]] = []

    def look(self) -> None:
        """Look for the GPUs now, in a thread (loading NVML takes tens of milliseconds),
        so the first stop does not wait for it. A node without NVIDIA's driver device or
        ``nvidia-smi`` has none: nothing is loaded there."""
        if self._looked or not self.timeout:
            return
        self._looked = True
        if may_have_gpus():
            from agentd.gpus.usage import open_usage

            self._looking = asyncio.ensure_future(asyncio.to_thread(open_usage, self._helpers))

    async def _opened(self) -> GpuUsage | None:
        self.look()
        if self._looking is None:
            return None
        if self._usage is None:  # (shared: a caller cancelled meanwhile leaves it running)
            self._usage = await asyncio.shield(self._looking)
            if self._usage is not None:
                log.debug("GPU memory is read through %s", self._usage.name)
        return self._usage

    async def watched(self, pids: Iterable[int]) -> set[int]:
        """``pids`` and their descendants now, before they are stopped (empty when there
        is nothing to wait for)."""
        pids = set(pids)
        if not self.timeout or not pids or await self._opened() is None:
            return set()
        from agentd.support.procfs import ProcessTable

        table = ProcessTable()
        return pids.union(*(table.tree(pid) for pid in pids))

    def stopped(self, pids: set[int]) -> None:
        """``pids`` (from :meth:`watched`) are stopped: wait for their memory in the
        background, from now on, until :meth:`settled` is awaited."""
        if pids and self._usage is not None:
            self._waits.append(asyncio.create_task(self.wait(pids), name="gpu-release"))

    async def settled(self) -> None:
        """Return once the waits :meth:`stopped` began are over (at once when there are
        none). Cancelling the caller leaves them running for the next call."""
        waits, self._waits = self._waits, []
        if not waits:
            return
        try:
            await asyncio.shield(asyncio.gather(*waits))
        except asyncio.CancelledError:
            self._waits = [w for w in waits if not w.done()] + self._waits
            raise

    async def wait(self, pids: set[int]) -> None:
        """Wait until none of ``pids`` holds GPU memory, or what they hold fits in what
        their GPUs have free (or it cannot be read), or until ``timeout`` passes."""
        usage = self._usage
        if not pids or usage is None:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout
        interval = FIRST_INTERVAL
        told = False
        while True:
            memory = await usage.read()
            if memory is None:
                return
            held = {pid: on for pid, on in memory.held.items() if pid in pids}
            if not held:
                if told:
                    log.info(
                        "The stopped workers' GPU memory was released after %.2fs",
                        loop.time() - started,
                    )
                return
            if fits(held, memory.free):
                log.info(
                    "The stopped workers' GPU memory fits in what their GPUs have free "
                    "(%s): the next workers need not wait for its release",
                    describe(held, memory.free),
                )
                return
            if loop.time() >= deadline:
                log.warning(
                    "The stopped workers still hold GPU memory after %.0fs (%s); "
                    "starting the next workers anyway (--gpu-release-timeout)",
                    self.timeout,
                    describe(held, memory.free),
                )
                return
            if not told:
                log.info(
                    "Waiting up to %.0fs for the stopped workers' GPU memory: %s",
                    self.timeout,
                    describe(held, memory.free),
                )
                told = True
            await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
            interval = min(interval * 2, MAX_INTERVAL)


def needed(held: dict[int, dict[str, int]]) -> dict[str, int]:
    """The MiB ``held`` (by pid, then GPU) adds up to on each GPU."""
    total: dict[str, int] = {}
    for on in held.values():
        for gpu, mib in on.items():
            total[gpu] = total.get(gpu, 0) + mib
    return total


def fits(held: dict[int, dict[str, int]], free: dict[str, int]) -> bool:
    """Whether each GPU has at least as much free as the stopped processes hold there:
    their successors can then allocate as much again before it is released. A GPU whose
    free memory is unknown has no room."""
    return all(free.get(gpu, -1) >= mib for gpu, mib in needed(held).items())


def describe(held: dict[int, dict[str, int]], free: dict[str, int]) -> str:
    """``pid 123 holds 2048 MiB on GPU 0, pid 124 holds 512 MiB on GPU 1; GPU 0 has
    1024 MiB free, GPU 1 has 70000 MiB free``."""
    parts = ", ".join(
        f"pid {pid} holds {mib} MiB on GPU {gpu}"
        for pid, on in sorted(held.items())
        for gpu, mib in sorted(on.items())
    )
    room = [f"GPU {gpu} has {free[gpu]} MiB free" for gpu in sorted(needed(held)) if gpu in free]
    return parts + ("; " + ", ".join(room) if room else "")
