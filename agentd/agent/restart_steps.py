"""The template's restarts: start a group after its rendezvous, spend a restart on a
failure (after the backoff), give up when none is left, and stop then start again (a
mixin of :class:`~agentd.agent.template.SimpleElasticAgent`, whose loop decides which).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from agentd.agent.rendezvous_steps import RendezvousSteps
from agentd.group import RunResult, WorkerFailure, WorkerGroup, WorkerState
from agentd.rendezvous.api import KnowsFinishedNodes
from agentd.support.sync_bridge import agent_step, call_step, is_agentd_step

log = logging.getLogger(__name__)


class RoundOverBeforeStart(Exception):
    """Raised by a start step that has started nothing because the round it was to start
    in is over (its text: why); the agent joins the next round instead."""


class RestartSteps(RendezvousSteps):
    """Restart and start steps of the agent template (state lives on the agent)."""

    _remaining_restarts: int
    _consecutive_failures: int
    _healthy_since: float | None
    restart_count: int

    if TYPE_CHECKING:  # the template's

        def _notify(self, hook: str, *args: object) -> None: ...

        def _raise_if_stop_requested(self) -> None: ...

        def _record_restart(self) -> None: ...

        async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]: ...

        async def _stop_workers(self, worker_group: WorkerGroup) -> None: ...

    async def _restart_after(self, group: WorkerGroup, reason: str) -> None:
        """Spend a restart on a failed or unhealthy group: the peers restart too."""
        spec = group.spec
        self._remaining_restarts -= 1
        self._record_restart()
        self.restart_count += 1
        self._notify("restarted", reason, self.restart_count)
        await self._stop_as_round_ends(group, f"worker {reason} on this node")
        self._set_state(WorkerState.STOPPED, "restarting")
        await self._backoff(spec.role)
        log.info(
            "[%s] Restarting worker group (restart %d of %d)",
            spec.role,
            self.restart_count,
            spec.max_restarts,
        )
        await self._restart_group(group, reason=reason, stopped=True)

    async def _no_round_to_restart_in(self, group: WorkerGroup, failed: str) -> bool:
        """Whether a restart would meet no round, said with ``failed`` (what failed): members
        of the round whose workers succeeded run no more (they wait in their exit barrier),
        and the rest, with the nodes waiting to join, are fewer than MIN. Restarting would
        wait for them while their barrier waited for us, up to its timeout (300 s by
        default); giving up closes the rendezvous as failed, which ends their wait now."""
        handler = self.rdzv_handler
        if not isinstance(handler, KnowsFinishedNodes) or (group.group_world_size or 1) < 2:
            return False
        finished = await handler.finished()
        needed = handler.min_nodes()
        if not finished or await self._enough_without(group, needed, gone=len(finished)):
            return False
        log.warning(
            "[%s] %s; not restarting: the workers of group rank(s) %s have succeeded (those "
            "nodes wait in their exit barrier and run no more), and no round of %d node(s) "
            "can form without them",
            group.spec.role,
            failed,
            ", ".join(map(str, finished)),
            needed,
        )
        return True

    async def _give_up(self, group: WorkerGroup, result: RunResult, reason: str) -> RunResult:
        """The group failed for good: close the rendezvous as failed, stop, FAILED."""
        root = result.root_cause
        if root is not None and not group.spec.restart_policy.is_retryable(root.exitcode):
            log.error(
                "[%s] Exit code %d is non-retryable; not restarting", group.spec.role, root.exitcode
            )
        self._stop_round_watch()
        why = root.summary() if root is not None else f"worker group {reason}"
        closing = asyncio.create_task(self._close_rendezvous(False, why))
        await self._timed_stop(group)
        await closing
        self._set_state(WorkerState.FAILED, "no restarts left")
        return RunResult(WorkerState.FAILED, result.return_values, result.failures)

    async def _pace(self, interval: float) -> None:
        """Wait ``interval`` before polling a plain ``_monitor_workers`` again (a stop
        request or the end of the round cuts the wait short)."""
        try:
            async with asyncio.timeout(interval):
                await self._wakeup.wait()
        except TimeoutError:
            return
        self._wakeup.clear()

    @agent_step
    async def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        """Rendezvous, assign ranks and start the workers; the group becomes HEALTHY. The
        round is watched from its completion, so a start that must wait (for the zygote's
        preload, say) starts nothing once it is over (:class:`RoundOverBeforeStart`): the
        next round is joined instead."""
        group = worker_group
        while True:
            self._raise_if_stop_requested()
            self._stop_round_watch()
            began = time.monotonic()
            await self._unless_stopped(call_step(self._rendezvous, group))
            self._notify("phase_timed", "rendezvous", time.monotonic() - began)
            self._raise_if_stop_requested()
            self._round_watch = asyncio.create_task(self._watch_round(), name="round-watch")
            began = time.monotonic()
            try:
                pids = await call_step(self._start_workers, group)
                break
            except RoundOverBeforeStart as over:
                log.info(
                    "[%s] Rendezvous round over before the workers started (%s); joining the "
                    "next round",
                    group.spec.role,
                    over,
                )
        if not isinstance(pids, dict):
            raise TypeError(
                f"{type(self).__name__}._start_workers() returned {pids!r}; it "
                "must return the workers' ids (pids) by local rank"
            )
        self._notify("phase_timed", "start", time.monotonic() - began)
        for worker in group.workers:
            worker.id = pids.get(worker.local_rank)
        self._healthy_since = time.monotonic()
        if group.state in (WorkerState.STOPPED, WorkerState.FAILED):  # set by a subclass
            self._set_state(WorkerState.INIT, "workers starting")
        self._set_state(WorkerState.HEALTHY, "workers started")

    @agent_step
    async def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """Stop the group and start it again after a new rendezvous (torch's step)."""
        await self._stop_then_start(worker_group, "restart", stopped=False)

    async def _restart_group(self, group: WorkerGroup, reason: str, stopped: bool = False) -> None:
        """The template's restart: a subclass's own ``_restart_workers`` if it has one."""
        if is_agentd_step(self._restart_workers):
            await self._stop_then_start(group, reason, stopped)
            return
        if stopped:
            self._set_state(WorkerState.INIT, f"restart ({reason})")
        await call_step(self._restart_workers, group)

    async def _stop_then_start(self, group: WorkerGroup, reason: str, stopped: bool) -> None:
        """Stop (unless already stopped) and start the group again after a new rendezvous."""
        if not stopped:
            await self._timed_stop(group)
            self._set_state(WorkerState.STOPPED, reason)
        self._set_state(WorkerState.INIT, f"restart ({reason})")
        await self._initialize_workers(group)

    async def _timed_stop(self, group: WorkerGroup) -> None:
        began = time.monotonic()
        await call_step(self._stop_workers, group)
        self._notify("phase_timed", "stop", time.monotonic() - began)

    async def _backoff(self, role: str) -> None:
        spec = self._worker_group.spec
        healthy_for = time.monotonic() - (self._healthy_since or time.monotonic())
        if healthy_for >= spec.restart_backoff.maximum:
            self._consecutive_failures = 0
        self._consecutive_failures += 1
        delay = spec.restart_backoff.delay(self._consecutive_failures)
        if delay <= 0:
            return
        log.info("[%s] Waiting %.2fs before restarting (backoff)", role, delay)
        try:  # only a stop request cuts the backoff short, not the stopped workers' exits
            async with asyncio.timeout(delay):
                await self._stop_requested.wait()
        except TimeoutError:
            return
        self._raise_if_stop_requested()


def what_failed(root: WorkerFailure | None, reason: str) -> str:
    """Who failed and how, in one line: the root cause's summary, else the group's state."""
    if root is None:
        return f"The worker group is {reason}"
    line = root.summary().splitlines()[0]
    return line[:1].upper() + line[1:]
