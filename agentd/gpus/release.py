"""After the agent stops workers, wait until none of them holds memory on the node's GPUs.

A process's GPU memory is freed as it exits, but not at once: the driver tears its
context down, and a process of the worker's tree that the stop did not wait for may
still hold some. New workers started on a nearly full GPU meanwhile die of CUDA out of
memory. :class:`GpuRelease` reads the holders (:mod:`agentd.gpus.usage`) and waits,
bounded, until none of the stopped processes is among them; it logs what is still held
and by which pid, and never fails the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentd.gpus import may_have_gpus

if TYPE_CHECKING:
    from agentd.gpus.usage import GpuUsage

log = logging.getLogger(__name__)

FIRST_INTERVAL = 0.05
MAX_INTERVAL = 0.5


class GpuRelease:
    """Waits up to ``timeout`` seconds after a stop for the stopped processes' GPU memory
    (0: never waits). The GPUs are looked for once: by :meth:`look`, or at the first
    stop."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._usage: GpuUsage | None = None
        self._looked = False
        self._looking: asyncio.Future[GpuUsage | None] | None = None

    def look(self) -> None:
        """Look for the GPUs now, in a thread (loading NVML takes tens of milliseconds),
        so the first stop does not wait for it. A node without NVIDIA's driver device or
        ``nvidia-smi`` has none: nothing is loaded there."""
        if self._looked or not self.timeout:
            return
        self._looked = True
        if may_have_gpus():
            from agentd.gpus.usage import open_usage

            self._looking = asyncio.ensure_future(asyncio.to_thread(open_usage))

    async def _opened(self) -> GpuUsage | None:
        self.look()
        if self._looking is None:
            return None
        if self._usage is None:
            self._usage = await self._looking
            if self._usage is not None:
                log.debug("GPU memory is read through %s", self._usage.name)
        return self._usage

    async def watched(self, pids: Iterable[int]) -> set[int]:
        """``pids`` and their descendants now, before they are stopped (empty when there
        is nothing to wait for)."""
        pids = set(pids)
        if not self.timeout or not pids or await self._opened() is None:
            return set()
        import psutil

        watched = set(pids)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                watched.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        return watched

    async def wait(self, pids: set[int]) -> None:
        """Wait until none of ``pids`` holds GPU memory (or it cannot be read), or until
        ``timeout`` passes."""
        usage = self._usage
        if not pids or usage is None:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout
        interval = FIRST_INTERVAL
        told = False
        while True:
            holders = await usage.holders()
            if holders is None:
                return
            held = {pid: mib for pid, mib in holders.items() if pid in pids}
            if not held:
                if told:
                    log.info(
                        "The stopped workers' GPU memory was released after %.2fs",
                        loop.time() - started,
                    )
                return
            if loop.time() >= deadline:
                log.warning(
                    "The stopped workers still hold GPU memory after %.0fs (%s); "
                    "starting the next workers anyway (--gpu-release-timeout)",
                    self.timeout,
                    describe(held),
                )
                return
            if not told:
                log.info(
                    "Waiting up to %.0fs for the stopped workers' GPU memory: %s",
                    self.timeout,
                    describe(held),
                )
                told = True
            await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
            interval = min(interval * 2, MAX_INTERVAL)


def describe(held: dict[int, int]) -> str:
    """``pid 123 holds 2048 MiB, pid 124 holds 512 MiB``."""
    return ", ".join(f"pid {pid} holds {mib} MiB" for pid, mib in sorted(held.items()))
