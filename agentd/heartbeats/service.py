"""The heartbeat service: hang detection and step times for the agent's workers.

Progress messages arrive on the watchdog's pipe; those of processes that are not in this
agent's worker trees are counted and dropped (the timers' trust rule). A trusted worker's
message that arrives while its attempt is still being started (a spawned worker runs from
its exec, before the agent has placed every worker of the group) is held, and fed once the
attempt is watched: no message of our own workers is dropped. The engine
(:mod:`agentd.heartbeats.hang_watch`) is built at the first trusted message, so a job
whose workers never call ``agentd.heartbeat()`` loads none of it, unless flags give a
timeout or a previous agent of the run learned some (``heartbeats.json``): then from the
start, so those timeouts hold workers that never heartbeat.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from agentd.heartbeats.settings import LEARNED_FILE, HeartbeatSettings
from agentd.wire.progress import ProgressMessage

if TYPE_CHECKING:
    from agentd.group import WorkerGroup
    from agentd.heartbeats.hang_watch import HangWatch
    from agentd.heartbeats.stragglers import StepTimes
    from agentd.timer.service import Watchdog
    from agentd.view import AgentView, Helpers
    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

_WARN_INTERVAL = 10.0
_MAX_EARLY = 4096
"""Messages held for workers of an attempt that is still starting (a bound, not a need:
a worker sends a handful before the agent has placed it)."""


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
        helpers: Helpers | None = None,
    ) -> None:
        self._agent = agent
        self._helpers = helpers
        self._watchdog = watchdog
        self._notify = notify
        self._dump_wait = dump_wait
        self.settings = settings
        self.stats: collections.Counter[str] = collections.Counter()
        self._pids: dict[int, int] = {}
        """The workers' own pids -> local rank, this attempt (trusted while they run)."""
        self._attempt: tuple[dict[int, int], dict[int, int], frozenset[int]] | None = None
        """The running attempt's pids and global ranks, by local rank, and the local ranks
        resumed in process."""
        self._engine: HangWatch | None = None
        self._warned_at = -_WARN_INTERVAL
        self._early: list[ProgressMessage] = []
        """Trusted messages of workers not yet placed (their attempt is starting)."""
        self._preload_s = 0.0

    @property
    def engine(self) -> HangWatch:
        """The hang detection engine, built on first use."""
        if self._engine is None:
            from agentd.heartbeats.hang_watch import HangWatch

            self._engine = HangWatch(
                self._agent,
                self._watchdog,
                self.settings,
                self._notify,
                self._dump_wait,
                self.stats,
                self._helpers,
            )
            self._engine.timeouts.allowance = self._preload_s
            if self._attempt is not None:
                self._engine.watch(*self._attempt)
        return self._engine

    @property
    def step_times(self) -> StepTimes:
        return self.engine.step_times

    def node_sections(self) -> dict[str, float] | None:
        """This node's recent compute time per section (None: no worker heartbeats yet)."""
        return self._engine.step_times.node_summary() if self._engine is not None else None

    async def start(self) -> None:
        settings = self.settings
        if (
            settings.initial_timeout is not None
            or settings.step_timeout is not None
            or settings.section_timeouts
            or (self._agent.run_dir / LEARNED_FILE).exists()
        ):
            _ = self.engine

    async def stop(self) -> None:
        await self.stopped()
        if self._engine is not None:
            self._engine.timeouts.save()

    def started(
        self,
        group: WorkerGroup,
        procs: list[WorkerProcess],
        resumed: Collection[int] = (),
        preload_s: float = 0.0,
    ) -> None:
        """A new attempt's workers run: watch them. ``resumed``: the local ranks that kept
        their process; ``preload_s``: how long this node's zygote took to preload (a node
        that joined just now may start its workers that much later: a rank resumed here
        waits for them)."""
        self._pids = {p.pid: p.local_rank for p in procs}
        ranks = {w.local_rank: w.global_rank for w in group.workers}
        self._attempt = ({p.local_rank: p.pid for p in procs}, ranks, frozenset(resumed))
        self._preload_s = preload_s
        if self._engine is not None:
            self._engine.timeouts.allowance = preload_s
            self._engine.watch(*self._attempt)
        early, self._early = self._early, []
        if early:
            self.feed(early)

    def hold(self, seconds: float | None) -> None:
        """Judge no hang for ``seconds`` from now (None: from now on again), as a drain
        pauses the workers and they checkpoint
        (:meth:`~agentd.heartbeats.monitor.ProgressMonitor.hold`)."""
        if self._engine is not None:
            self._engine.monitor.hold(seconds)

    def beats_due_in(self) -> float | None:
        """Seconds within which every worker that heartbeats will beat again unless hung
        (:meth:`~agentd.heartbeats.monitor.ProgressMonitor.beats_due_in`)."""
        return self._engine.monitor.beats_due_in() if self._engine is not None else None

    async def where(self, local_ranks: Collection[int]) -> dict[int, str]:
        """Where these workers are now, from their stacks (see
        :meth:`~agentd.heartbeats.hang_watch.HangWatch.where`); none before a heartbeat."""
        return await self._engine.where(local_ranks) if self._engine is not None else {}

    async def stopped(self) -> None:
        """The attempt's workers are being stopped: watch nothing, dump nothing more."""
        self._pids = {}
        self._attempt = None
        self._early = []
        if self._engine is not None:
            await self._engine.unwatch()

    def feed(self, messages: list[ProgressMessage]) -> None:
        """Progress messages from the pipe, in order; foreign pids are dropped."""
        pairs = []
        for message in messages:
            if self._attempt is None:  # no attempt watched yet: a trusted worker's waits
                if not self._held(message):
                    self._drop(message.pid)
                continue
            local_rank = self._local_rank_of(message.pid)
            if local_rank is None:
                self._drop(message.pid)
                continue
            pairs.append((local_rank, message))
        self.stats["accepted"] += len(pairs)
        if pairs:
            self.engine.feed(pairs)

    def _local_rank_of(self, pid: int) -> int | None:
        local_rank = self._pids.get(pid)
        if local_rank is not None:
            return local_rank
        if self._watchdog.trust(pid) is None:
            return None
        proc = self._agent.worker_process_of(pid)
        return proc.local_rank if proc is not None else None

    def _held(self, message: ProgressMessage) -> bool:
        """Hold a trusted worker's message until its attempt is watched (False: not ours,
        or too many held)."""
        if len(self._early) >= _MAX_EARLY or self._watchdog.trust(message.pid) is None:
            return False
        self._early.append(message)
        return True

    def _drop(self, pid: int) -> None:
        if self._watchdog.gone(pid):  # sent as our worker exited: late, not foreign
            self.stats["late"] += 1
            return
        self.stats["untrusted"] += 1
        now = time.monotonic()
        if now - self._warned_at >= _WARN_INTERVAL:
            self._warned_at = now
            log.warning(
                "Progress message dropped (untrusted, %d so far): pid %d is not one of our workers",
                self.stats["untrusted"],
                pid,
            )

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows under ``heartbeats``."""
        engine = self.engine
        return {
            "watching": engine.monitor.active(),
            "timeouts": engine.timeouts.status(),
            "workers": engine.monitor.status(),
            "hangs": self.stats["hangs"],
            "stragglers": self.stats["stragglers"],
            "messages": {
                "accepted": self.stats["accepted"],
                "untrusted": self.stats["untrusted"],
            },
        }
