"""The heartbeat service: hang detection and step times for the agent's workers.

Progress messages arrive on the watchdog's pipe; those of processes that are not in this
agent's worker trees are counted and dropped (the timers' trust rule). The monitor holds
each worker to its timeout; on a hang the service dumps the stacks of every local worker,
judges which rank hung first, and reports it to the watchdog as unhealthy, so the group
stops, and restarts per the restart policy, and the peers' round ends, like any failure.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.heartbeats import stacks
from agentd.heartbeats.monitor import ProgressMonitor, Silence
from agentd.heartbeats.stacks import STACK_FILE
from agentd.heartbeats.stragglers import StepTimes, Straggler
from agentd.heartbeats.timeouts import HeartbeatSettings, LearnedTimeouts, key_name
from agentd.heartbeats.verdict import judge
from agentd.heartbeats.wire import ProgressMessage
from agentd.support.aio import cancel_and_wait
from agentd.workers.output import attempt_dir

if TYPE_CHECKING:
    from agentd.group import WorkerGroup
    from agentd.timer.service import Watchdog
    from agentd.view import AgentView
    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

_WARN_INTERVAL = 10.0
WAIT_FOR_OTHER_NODE = 3.0
"""Seconds a node whose ranks all wait in a collective leaves the other nodes to report."""


class HeartbeatService:
    """Watches ``agent``'s workers for hangs as ``settings`` say; ``notify(hook, *args)``
    tells the agent's observers (``hang_detected``, ``straggler``)."""

    def __init__(
        self,
        agent: AgentView,
        watchdog: Watchdog,
        settings: HeartbeatSettings,
        notify: Callable[..., None],
        dump_wait: float = 2.0,
    ) -> None:
        self._agent = agent
        self._watchdog = watchdog
        self._notify = notify
        self._dump_wait = dump_wait
        self.settings = settings
        self.timeouts = LearnedTimeouts(settings, agent.run_dir / "heartbeats.json")
        self.step_times = StepTimes(
            settings.straggler_factor, settings.straggler_steps, self._on_straggler
        )
        self.monitor = ProgressMonitor(
            self.timeouts, self.step_times, self._on_hang, self._running,
            drain=watchdog.timer_server.drain,
        )  # fmt: skip
        self.stats: collections.Counter[str] = collections.Counter()
        self._pids: dict[int, int] = {}
        """The workers' own pids -> local rank, this attempt (trusted while they run)."""
        self._handling: asyncio.Task[None] | None = None
        self._warned_at = -_WARN_INTERVAL
        watchdog.progress_sink = self.feed

    async def start(self) -> None:
        self.timeouts.load()

    async def stop(self) -> None:
        await self.stopped()
        self.timeouts.save()

    def started(self, group: WorkerGroup, procs: list[WorkerProcess]) -> None:
        """A new attempt's workers run: watch them."""
        self._pids = {p.pid: p.local_rank for p in procs}
        ranks = {w.local_rank: w.global_rank for w in group.workers}
        self.monitor.watch({p.local_rank: p.pid for p in procs}, ranks)

    async def stopped(self) -> None:
        """The attempt's workers are being stopped: watch nothing, dump nothing more."""
        self.monitor.unwatch()
        self._pids = {}
        handling, self._handling = self._handling, None
        await cancel_and_wait(handling)

    def feed(self, messages: list[ProgressMessage]) -> None:
        """Progress messages from the pipe, in order; foreign pids are dropped."""
        pairs = []
        for message in messages:
            local_rank = self._local_rank_of(message.pid)
            if local_rank is None:
                self._drop(message.pid)
                continue
            pairs.append((local_rank, message))
        self.stats["accepted"] += len(pairs)
        if pairs:
            self.monitor.feed(pairs)

    def _local_rank_of(self, pid: int) -> int | None:
        local_rank = self._pids.get(pid)
        if local_rank is not None:
            return local_rank
        if self._watchdog.trust(pid) is None:
            return None
        proc = self._agent.worker_process_of(pid)
        return proc.local_rank if proc is not None else None

    def _drop(self, pid: int) -> None:
        self.stats["untrusted"] += 1
        now = time.monotonic()
        if now - self._warned_at >= _WARN_INTERVAL:
            self._warned_at = now
            log.warning("Progress message dropped (untrusted, %d so far): pid %d is not one of "
                        "our workers", self.stats["untrusted"], pid)  # fmt: skip

    def _running(self, local_rank: int) -> bool:
        proc = self._agent.worker_processes().get(local_rank)
        return proc is not None and proc.returncode is None

    def _stack_file(self, local_rank: int) -> Path:
        return attempt_dir(self._agent.run_dir, self._agent.attempt, local_rank) / STACK_FILE

    # -- a hang ------------------------------------------------------------------------------

    def _on_hang(self, silences: list[Silence]) -> None:
        self._handling = asyncio.get_running_loop().create_task(
            self._handle_hang(silences), name="hang-report"
        )

    async def _handle_hang(self, silences: list[Silence]) -> None:
        detected_at = time.time()
        overdue = [s for s in silences if s.overdue]
        group = self._agent.get_worker_group()
        ranks = {w.local_rank: w.global_rank for w in group.workers}
        who = ", ".join(str(ranks.get(s.local_rank, s.local_rank)) for s in overdue)
        limits = dict.fromkeys(f"{key_name(s.section)} {s.timeout.describe()}" for s in overdue)
        log.error("Hang: no progress from rank(s) %s within their timeout (%s); dumping the "
                  "stacks of %d worker(s)", who, "; ".join(limits), len(silences))  # fmt: skip
        targets = [stacks.DumpTarget(s.local_rank, s.pid, s.dump_signal,
                                     self._stack_file(s.local_rank)) for s in silences]  # fmt: skip
        dumps = await stacks.capture(targets, self._dump_wait)
        where = attempt_dir(self._agent.run_dir, self._agent.attempt, 0).parent / "*" / STACK_FILE
        verdict = judge(silences, dumps, ranks, str(where))
        verdict.details["detected_at"] = detected_at
        if verdict.details["waiting_on_another_node"]:
            # Let the node of the rank we wait for report first: its report ends the round,
            # which restarts us too (and cancels this). Only then is ours the one to read.
            log.warning("Every local rank waits in a collective; giving the node that holds "
                        "them up %.0fs to report its hung rank", WAIT_FOR_OTHER_NODE)  # fmt: skip
            await asyncio.sleep(WAIT_FOR_OTHER_NODE)
        self.stats["hangs"] += 1
        log.error("%s", verdict.why)
        self._notify("hang_detected", verdict.details)
        self._watchdog.report(verdict.culprit.pid, verdict.why, verdict.details)

    def _on_straggler(self, straggler: Straggler) -> None:
        self.stats["stragglers"] += 1
        self._notify("straggler", straggler)

    # -- views -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows under ``heartbeats``."""
        return {
            "watching": self.monitor.active(),
            "timeouts": self.timeouts.status(),
            "workers": self.monitor.status(),
            "hangs": self.stats["hangs"],
            "stragglers": self.stats["stragglers"],
            "messages": {
                "accepted": self.stats["accepted"],
                "untrusted": self.stats["untrusted"],
            },
        }
