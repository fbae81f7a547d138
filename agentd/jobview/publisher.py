"""Keeps this node's status record (:mod:`agentd.jobview.record`) in the store while its
workers run: written when they start, then once every heartbeat interval, as a TTL key
of three intervals, so a node that stops writing drops out of the view on its own.

That is one store request per agent per interval (the heartbeat's own pace) beside the
heartbeat, and none while no workers run. A store that does not answer costs a skipped
record, logged at most once a minute: the job view is never worth the agent's attention.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentd.exceptions import AgentdError
from agentd.group import WorkerState
from agentd.jobview.record import StepRate, node_record
from agentd.support.aio import cancel_and_wait
from agentd.support.ratelog import RateLimitedLog
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.gpus.usage import GpuUsage
    from agentd.rendezvous.api import ShowsJob
    from agentd.view import AgentView

log = logging.getLogger(__name__)

TTL_INTERVALS = 3
"""A record lives this many intervals unless rewritten."""


def reachable(url: str | None, addr: str) -> str | None:
    """``url`` as another host reaches it: a wildcard listener's address is the node's."""
    if url is None:
        return None
    for wildcard in ("//0.0.0.0:", "//[::]:"):
        url = url.replace(wildcard, f"//{f'[{addr}]' if ':' in addr else addr}:")
    return url


class JobRecordPublisher(AgentObserver):
    """Publishes ``view``'s record through ``handler``'s store, as an observer of the
    worker group's state (the agent's services start and stop it)."""

    def __init__(
        self, view: AgentView, handler: ShowsJob, health_url: Callable[[], str | None]
    ) -> None:
        self._view = view
        self._handler = handler
        self._health_url = health_url
        self._rate = StepRate()
        self._task: asyncio.Task[None] | None = None
        self._trouble = RateLimitedLog(log, interval=60.0)
        self._nvml: GpuUsage | None = None
        self._looked_for_nvml = False
        self.published = 0

    @property
    def interval(self) -> float:
        return self._handler.settings.keep_alive_interval

    async def start(self) -> None:
        """Nothing until the workers run."""

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        if new is WorkerState.HEALTHY and self._task is None:
            self._task = asyncio.ensure_future(self._run())
        elif new is not WorkerState.HEALTHY and self._task is not None:
            self._task.cancel()  # its record lapses on its own; the next round's is new
            self._task = None

    async def _run(self) -> None:
        try:
            while True:
                await self.publish_once()
                await asyncio.sleep(self.interval)
        except Exception:  # a bug would fail every time: say so once, and stop
            log.exception("This node's job record is no longer published")

    async def publish_once(self) -> None:
        """Write the record once for the current round (a store problem is logged)."""
        view, job = self._view, self._handler.job
        rank = view.get_worker_group().group_rank
        if rank is None:
            return
        doc = node_record(view, job.node_id, job.addr, self._rate, await self._gpu_memory())
        doc["health"] = reachable(self._health_url(), job.addr)
        try:
            await job.publish(view.generation, rank, doc, TTL_INTERVALS * self.interval)
            self.published += 1
        except AgentdError as exc:
            self._trouble.warning("store", "Could not publish this node's job record: %s", exc)

    async def _gpu_memory(self) -> int | None:
        """MiB this node's workers hold on its GPUs, where NVML answers (None elsewhere:
        nvidia-smi, a process a reading, is not worth it every few seconds)."""
        if not self._looked_for_nvml:
            from agentd.gpus import may_have_gpus

            self._looked_for_nvml = True
            if may_have_gpus():
                from agentd.gpus.usage import NvmlUsage

                self._nvml = await asyncio.to_thread(NvmlUsage.open)
        if self._nvml is None:
            return None
        memory = await self._nvml.read()
        if memory is None:
            return None
        held = memory.by_pid()
        return sum(held.get(proc.pid, 0) for proc in self._view.worker_processes().values())
