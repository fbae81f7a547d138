"""The engine of hang detection, built at the first heartbeat (or at start when flags or a
previous run's learned timeouts ask for it): learned timeouts, step times and stragglers,
the monitor that holds each worker to its timeout, and what a hang sets off: the stacks of
every local worker dumped, the verdict on who hung first, and the watchdog told, so the
group restarts per policy like any failure."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from agentd.heartbeats import stacks
from agentd.heartbeats.monitor import ProgressMonitor, Silence
from agentd.heartbeats.settings import LEARNED_FILE, START, HeartbeatSettings
from agentd.heartbeats.stragglers import StepTimes, Straggler
from agentd.heartbeats.timeouts import LearnedTimeouts, key_name
from agentd.heartbeats.verdict import judge
from agentd.support.aio import cancel_and_wait
from agentd.wire.progress import STACK_FILE, ProgressMessage
from agentd.workers.output import attempt_dir

if TYPE_CHECKING:
    from agentd.timer.service import Watchdog
    from agentd.view import AgentView, Helpers

log = logging.getLogger(__name__)

WAIT_FOR_OTHER_NODE = 3.0
"""Seconds a node whose ranks all wait in a collective leaves the other nodes to report."""


class HangWatch:
    """Hang detection for ``agent``'s workers as ``settings`` say; ``notify(hook, *args)``
    tells the agent's observers (``hang_detected``, ``straggler``); ``stats`` counts hangs
    and stragglers; ``helpers``: the agent's process hygiene (py-spy is spawned)."""

    def __init__(
        self,
        agent: AgentView,
        watchdog: Watchdog,
        settings: HeartbeatSettings,
        notify: Callable[..., None],
        dump_wait: float,
        stats: collections.Counter[str],
        helpers: Helpers | None = None,
    ) -> None:
        self._agent = agent
        self._helpers = helpers
        self._watchdog = watchdog
        self._notify = notify
        self._dump_wait = dump_wait
        self.stats = stats
        self.timeouts = LearnedTimeouts(settings, agent.run_dir / LEARNED_FILE)
        self.timeouts.load()
        self.step_times = StepTimes(
            settings.straggler_factor, settings.straggler_steps, self._on_straggler
        )
        self.monitor = ProgressMonitor(
            self.timeouts,
            self.step_times,
            self._on_hang,
            self._running,
            drain=watchdog.drain,
        )
        self._handling: asyncio.Task[None] | None = None

    def watch(
        self, pids: dict[int, int], ranks: dict[int, int], resumed: Collection[int] = ()
    ) -> None:
        """Watch an attempt's workers: pid by local rank, global rank by local rank, and
        the local ranks resumed in process."""
        self.monitor.watch(pids, ranks, resumed)

    async def unwatch(self) -> None:
        """Watch nothing, dump nothing more (the attempt's workers are being stopped)."""
        self.monitor.unwatch()
        handling, self._handling = self._handling, None
        await cancel_and_wait(handling)

    def feed(self, pairs: list[tuple[int, ProgressMessage]]) -> None:
        """Trusted progress messages, by local rank, in order."""
        self.monitor.feed(pairs)

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
        limits = dict.fromkeys(
            f"{key_name(START if s.resumed else s.section)} {s.timeout.describe()}" for s in overdue
        )
        watched = [(s.local_rank, s.pid, s.dump_signal) for s in silences]
        targets = [
            stacks.DumpTarget(local_rank, pid, signal, self._stack_file(local_rank))
            for local_rank, pid, signal in watched + self.monitor.ended_but_running()
        ]
        log.error(
            "Hang: no progress from rank(s) %s within their timeout (%s); dumping the "
            "stacks of %d worker(s)",
            who,
            "; ".join(limits),
            len(targets),
        )
        dumps = await stacks.capture(targets, self._dump_wait, self._helpers)
        where = attempt_dir(self._agent.run_dir, self._agent.attempt, 0).parent / "*" / STACK_FILE
        verdict = judge(silences, dumps, ranks, str(where))
        verdict.details["detected_at"] = detected_at
        if verdict.details["waiting_on_another_node"]:
            # Let the node of the rank we wait for report first: its report ends the round,
            # which restarts us too (and cancels this). Only then is ours the one to read.
            log.warning(
                "Every local rank waits in a collective; giving the node that holds "
                "them up %.0fs to report its hung rank",
                WAIT_FOR_OTHER_NODE,
            )
            await asyncio.sleep(WAIT_FOR_OTHER_NODE)
        self.stats["hangs"] += 1
        log.error("%s", verdict.why)
        self._notify("hang_detected", verdict.details)
        self._watchdog.report(verdict.culprit.pid, verdict.why, verdict.details)

    async def where(self, local_ranks: Collection[int]) -> dict[int, str]:
        """Where each of these watched, running workers is now, from a dump of its stacks
        (``func (file:line)``, and the collective it waits in), for a log line; a worker
        that could not be dumped is left out."""
        watched = [(s.local_rank, s.pid, s.dump_signal) for s in self.monitor.silences()]
        targets = [
            stacks.DumpTarget(local_rank, pid, signal, self._stack_file(local_rank))
            for local_rank, pid, signal in watched + self.monitor.ended_but_running()
            if local_rank in local_ranks
        ]
        dumps = await stacks.capture(targets, self._dump_wait, self._helpers)
        return {
            lr: d.where + (f", in {d.waiting_in}" if d.waiting_in else "")
            for lr, d in dumps.items()
            if d.ok
        }

    def _on_straggler(self, straggler: Straggler) -> None:
        self.stats["stragglers"] += 1
        self._notify("straggler", straggler)
