"""The timer server torch's ``FileTimerClient`` talks to: requests arrive on a named pipe.

Under an agent the pipe is ``$TORCHELASTIC_TIMER_FILE`` (or a private one) and only the
agent's workers are believed; built on its own, as torch's tests and examples do, it is
torch's standalone server (see :mod:`agentd.timer.server`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.timer.api import TimerRequest
from agentd.timer.pipe import FifoSource
from agentd.timer.server import TimerServer

if TYPE_CHECKING:
    from agentd.wire.progress import ProgressMessage

log = logging.getLogger(__name__)


class FileTimerServer(TimerServer):
    """A timer server fed by the named pipe torch's ``FileTimerClient`` writes to.

    torch's signature; ``file_path`` None makes a private pipe (:attr:`path` tells where,
    once started). ``source``, a pipe already served (the watchdog's), is taken over
    instead. ``on_progress`` hears the pipe's progress messages (heartbeats and
    sections, :mod:`agentd.wire.progress`), which torch's server does not know.
    ``log_event(name, request)`` hears "watchdog started", "timer expired",
    "kill worker process" and "watchdog stopped", as torch's.
    """

    def __init__(
        self,
        file_path: str | None = None,
        run_id: str = "",
        max_interval: float = 10,
        daemon: bool = True,
        log_event: Callable[[str, TimerRequest | None], None] | None = None,
        on_progress: Callable[[list[ProgressMessage]], None] | None = None,
        *,
        source: FifoSource | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(None, max_interval, daemon, **kwargs)
        self.run_id = run_id
        if source is None:
            source = FifoSource(self, file_path, on_progress)
        source.registry = self
        self._source = source
        self._log_event = log_event
        self._ended: int | None = None
        """The epoch second the watchdog stopped, or its task ended (None: it runs, or
        has not started)."""

    @property
    def path(self) -> str:
        """The pipe's path, once it is open ("" before)."""
        return self._source.path

    def start_on_loop(self) -> None:
        if not self._source.is_open:
            self._source.open()
        first = self._task is None
        super().start_on_loop()
        if first and self._task is not None:
            self._ended = None
            self._task.add_done_callback(self._task_ended)
            self.log_event("watchdog started", None)

    def _task_ended(self, _: object) -> None:
        if self._ended is None:
            self._ended = int(self._wall())

    def get_last_progress_time(self) -> int:
        """torch's: the epoch second of the watchdog's last sign of progress, the alive
        callback torch's agent gives its health check server. This server is woken by
        events, not by passes: while :meth:`alive`, its progress is now; with a deadline
        overdue beyond ``max_overdue`` (its loop blocked), the second that deadline fell
        due; stopped, or its task ended, the second it did. Before it starts: now, as
        torch's answers before a client opens the pipe."""
        task = self._task
        if task is None or task.done():
            return self._ended if self._ended is not None else int(self._wall())
        head = self.next_deadline()
        late = 0.0 if head is None else self._clock() - head
        return int(self._wall() - (late if late > self.max_overdue else 0.0))

    async def stop_async(self) -> None:
        self._task_ended(None)
        await super().stop_async()
        self._source.close()
        self.log_event("watchdog stopped", None)

    def drain(self) -> None:
        """Read what is waiting on the pipe now (the loop would, at its next turn)."""
        self._source.drain()

    def _take_requests(self) -> list[TimerRequest]:
        self.drain()  # the pipe's requests go straight to register_timers
        return []

    def _reap_expired(self, worker_id: int, expired: list[TimerRequest]) -> bool:
        return bool(self._reap_worker(worker_id, expired[-1].signal))

    def run_once(self) -> None:
        """torch's ``run_once``: one watchdog pass now (read the pipe, reap what expired),
        on the server's own loop when it was started with :meth:`start`."""
        if self._background is not None:

            async def one_pass() -> None:
                self._run_watchdog()

            self._background.call(one_pass)
        else:
            self._run_watchdog()

    def log_event(self, name: str, request: TimerRequest | None) -> None:
        if self._log_event is not None:
            try:
                self._log_event(name, request)
            except Exception:
                log.exception("FileTimerServer log_event(%r) failed", name)
