"""The watchdog service: expiration timers and D-state detection for the agent's workers.

A worker whose timer runs out is reaped by the timer server; one stuck in uninterruptible
sleep past the timeout is reported by the hang monitor. Either way the worker is noted as
unhealthy and the agent woken: the group then restarts per policy, like a failure. Timer
requests are trusted only for the agent's own worker trees (:meth:`Watchdog.trust`).

The pipe is served from the start (:mod:`agentd.timer.pipe`); the timer server is built
with the first request on it, so a job whose workers set no timer never loads it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from agentd.hygiene import orphans
from agentd.timer.pipe import FifoSource
from agentd.timer.settings import WatchdogSettings

if TYPE_CHECKING:
    from agentd.timer.api import TimerRequest
    from agentd.timer.dstate import UninterruptibleMonitor
    from agentd.timer.file_server import FileTimerServer
    from agentd.wire.progress import ProgressMessage
    from agentd.workers.processes import WorkerProcess


REMEMBERED_GONE = 4096
"""How many exited workers' pids :meth:`Watchdog.gone` remembers."""


class Unhealthy(NamedTuple):
    """Worker ``pid`` was found unhealthy at ``when`` (epoch seconds) because ``why``."""

    pid: int
    why: str
    when: float
    details: dict[str, Any] | None = None
    """What a hang report adds (see :mod:`agentd.heartbeats.verdict`)."""


class Watchdog:
    """The watchdog of an agent whose current workers are ``procs()`` and carry ``mark``;
    ``wake()`` tells the agent to look at its workers again."""

    def __init__(
        self,
        settings: WatchdogSettings,
        procs: Callable[[], Mapping[int, WorkerProcess]],
        mark: str,
        wake: Callable[[], None],
        max_overdue: float | None = None,
        rank_of: Callable[[int], int | None] = lambda _local_rank: None,
    ) -> None:
        self._settings = settings
        self._procs = procs
        self._rank_of = rank_of
        """The global rank of the worker at a local rank (None: not known)."""
        self._gone: dict[int, None] = {}
        """Pids of our workers that exited or were stopped, the latest last."""
        self._mark = mark
        self._wake = wake
        self._max_overdue = max_overdue
        # The pipe is always served: heartbeats travel on it. Only --file-timer tells the
        # workers about it as torch's TORCHELASTIC_TIMER_FILE (torch scripts look for it).
        self._pipe = FifoSource(
            self, settings.timer_file if settings.file_timer else None, self._on_progress
        )
        self._server: FileTimerServer | None = None
        self._running = False
        self._hang_monitor: UninterruptibleMonitor | None = None
        self._progress_sink: Callable[[list[ProgressMessage]], None] | None = None
        self.unhealthy: list[Unhealthy] = []
        """Workers reaped, found stuck or hung since the group started."""
        self._listeners: list[Callable[[Unhealthy], None]] = []

    @property
    def timer_server(self) -> FileTimerServer:
        """The timer server on the pipe, built when first needed: by the pipe's first timer
        request (or bad line), or by a caller that asks (the health endpoint); it runs
        while the watchdog does."""
        if self._server is None:
            from agentd.timer.file_server import FileTimerServer

            server = FileTimerServer(
                source=self._pipe,
                trust=self.trust,
                gone=self.gone,
                on_expired=self._on_timer_expired,
                dump_signal=self._settings.dump_signal,
                dump_grace=self._settings.dump_grace,
                describe=self.describe,
            )
            if self._max_overdue is not None:
                server.max_overdue = self._max_overdue
            self._server = server
            if self._running:
                server.start_on_loop()
        return self._server

    def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None:
        """The pipe's first requests: they build the timer server, which takes the pipe's
        next ones itself."""
        self.timer_server.register_timers(timer_requests)

    def count_bad(self, kind: str, detail: str) -> None:
        """A bad line on the pipe before any request: counted by the timer server too."""
        self.timer_server.count_bad(kind, detail)

    @property
    def dump_grace(self) -> float:
        return self._settings.dump_grace

    @property
    def timer_file(self) -> str | None:
        """The named pipe workers write timer requests to (None without --file-timer)."""
        return self._pipe.path if self._settings.file_timer else None

    @property
    def progress_pipe(self) -> str | None:
        """The named pipe workers write heartbeats to (the same pipe), once started."""
        return self._pipe.path or None

    @property
    def pipe_dir(self) -> str | None:
        """The private directory holding the pipe, when the watchdog made it."""
        return self._pipe.private_dir

    def drain(self) -> None:
        """Read what is waiting on the pipe now (the loop would, at its next turn)."""
        self._pipe.drain()

    def on_progress(self, sink: Callable[[list[ProgressMessage]], None]) -> None:
        """Send the pipe's progress messages to ``sink`` (the heartbeat service)."""
        self._progress_sink = sink

    def _on_progress(self, messages: list[ProgressMessage]) -> None:
        if self._progress_sink is not None:
            self._progress_sink(messages)

    def report(self, pid: int, why: str, details: dict[str, Any] | None = None) -> None:
        """Worker ``pid`` is unhealthy (``details`` go to its failure's report): the
        group restarts per policy."""
        found = Unhealthy(pid, why, time.time(), details)
        self.unhealthy.append(found)
        for listener in list(self._listeners):
            listener(found)
        self._wake()

    @contextlib.contextmanager
    def reports_to(self, listener: Callable[[Unhealthy], None]) -> Iterator[None]:
        """Within the block, hand each new report to ``listener`` as it is made: the agent
        stopping its workers acts on a hang found meanwhile, which it would otherwise
        read only after the stop."""
        self._listeners.append(listener)
        try:
            yield
        finally:
            self._listeners.remove(listener)

    async def start(self) -> None:
        self._running = True
        if self._server is not None:
            self._server.start_on_loop()  # opens the pipe
        else:
            self._pipe.open()
        if self._settings.uninterruptible_timeout > 0:
            from agentd.timer.dstate import UninterruptibleMonitor

            self._hang_monitor = UninterruptibleMonitor(
                lambda: [p.pid for p in self._procs().values() if p.returncode is None],
                self._settings.uninterruptible_timeout,
                self._on_stuck,
            )
            await self._hang_monitor.start()

    def sweep_stale_pipes(self) -> None:
        """Remove the pipe directories of agents that died before their guardian could (see
        :func:`~agentd.timer.pipe.sweep_stale_pipe_dirs`), if ours is one such: called
        once our first workers run, as it scans the whole temporary folder."""
        if self._pipe.private_dir:
            from agentd.support.tempdirs import temp_root
            from agentd.timer.pipe import sweep_stale_pipe_dirs

            sweep_stale_pipe_dirs(temp_root())

    async def stop(self) -> None:
        if self._hang_monitor is not None:
            await self._hang_monitor.stop()
            self._hang_monitor = None
        self._running = False
        if self._server is not None:
            await self._server.stop_async()  # closes the pipe
        self._pipe.close()

    def forget(self, pids: Iterable[int]) -> None:
        """These workers exited or were stopped: their timers go, and so does what was
        noted against them once every worker is gone. Their pids are remembered a while
        (:meth:`gone`): a request they sent just before they exited may be read after."""
        pids = list(pids)
        if self._server is not None:
            self._server.clear_timers(pids)
        self._gone.update(dict.fromkeys(pids))
        while len(self._gone) > REMEMBERED_GONE:
            del self._gone[next(iter(self._gone))]

    def gone(self, pid: int) -> bool:
        """Whether ``pid`` was one of our workers, now exited or stopped: what it sent is
        late, not foreign (dropped without a warning). A worker forked from the zygote is
        reaped by the zygote as it exits, before the agent hears of it: its pid is then
        one of ours that no longer exists."""
        if pid in self._gone:
            return True
        proc = next((p for p in self._procs().values() if p.pid == pid), None)
        if proc is None:
            return False
        if proc.returncode is not None:
            return True
        from agentd.timer.expiry import Expiry

        return not Expiry.is_process_running(pid)

    def clear(self) -> None:
        """The group was stopped: start the next one with a clean slate."""
        self.unhealthy.clear()

    def describe(self, pid: int) -> str:
        """Worker ``pid`` (or a process of its group) as a person knows it: its ranks."""
        try:
            pgid = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            pgid = pid
        for local_rank, proc in self._procs().items():
            if proc.pid in (pid, pgid):
                rank = self._rank_of(local_rank)
                known = "" if rank is None else f"rank {rank}, "
                return f"{known}local rank {local_rank} (pid {pid})"
        return f"pid {pid}"

    def trust(self, pid: int) -> int | None:
        """The process group to signal for a timer of ``pid``; None unless it is ours.

        Ours: in the process group of one of our running workers, or (a descendant that
        left its group) carrying this agent's owner mark. Never the agent's own group.
        """
        try:
            pgid = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            return None
        if pgid == os.getpgid(0):
            return None
        if any(p.pgid == pgid and p.returncode is None for p in self._procs().values()):
            return pgid
        return pgid if orphans.read_mark(pid) == self._mark else None

    def _on_timer_expired(self, request: TimerRequest, pgid: int | None) -> None:
        if pgid is None:
            return  # signal <= 0: reported, not enforced
        from agentd.timer.expiry import signal_name

        why = (
            f"timer expired: scope {request.scope_id!r} of pid {request.worker_id}, "
            f"reaped with {signal_name(request.signal)}"
        )
        self.report(request.worker_id, why)

    def _on_stuck(self, pid: int, seconds: float) -> None:
        self.report(pid, f"in uninterruptible sleep (D state) for {seconds:.1f}s")
