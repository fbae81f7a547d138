"""The event log service: the run's events as DEBUG log records and, with ``--event-log``,
JSON lines in a file (rotated past its size; see :class:`agentd.telemetry.events.JsonLinesFile`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentd.exceptions import StartError
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.telemetry.events import Event, JsonLinesFile

log = logging.getLogger(__name__)


def _debug_event(event: Event) -> None:  # the events as DEBUG records
    log.debug("event %s", event.to_json())


class EventLog:
    """Records the events of run ``run_id`` (role ``role``) on ``host``; ``observe`` adds
    its observer to the agent."""

    def __init__(
        self,
        run_id: str,
        role: str,
        host: str,
        path: str | None,
        observe: Callable[[AgentObserver], None],
    ) -> None:
        self._run_id, self._role, self._host = run_id, role, host
        self._path = path
        self._observe = observe
        self._file: JsonLinesFile | None = None

    async def start(self) -> None:
        """Record the events into the file, and as DEBUG records when they are logged; with
        neither, nothing is loaded."""
        if not self._path and not log.isEnabledFor(logging.DEBUG):
            return
        from agentd.telemetry.events import AgentEvents, JsonLinesFile

        sinks: list[Callable[[Event], None]] = [_debug_event]
        if self._path:
            try:
                self._file = JsonLinesFile(self._path)
            except OSError as exc:
                raise StartError(f"event_log: cannot open {self._path}: {exc.strerror}") from None
            sinks.append(self._file)
        events = AgentEvents(self._run_id, self._role, sinks)
        self._observe(events)
        events.emit("agent_started", host=self._host, pid=os.getpid())

    async def stop(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
