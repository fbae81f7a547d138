"""Events: what happened to a run, as JSON lines (``--event-log FILE``) and log records.

Seed parity: ``Event``, ``EventSource`` and ``record(event)``. The agent records its own
events through :class:`AgentEvents`, an observer; ``record`` is for anyone else (a worker
or a library) and goes to the handler set with :func:`configure` (the log by default).
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.group import WorkerFailure, WorkerState
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.heartbeats.stragglers import Straggler

log = logging.getLogger(__name__)


class EventSource(enum.StrEnum):
    """Who an event is about."""

    AGENT = "AGENT"
    WORKER = "WORKER"


@dataclass(frozen=True)
class Event:
    """One thing that happened: a name, its source, when (epoch seconds), and details."""

    name: str
    source: EventSource = EventSource.AGENT
    timestamp: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)

    def serialize(self) -> str:
        """torch's name for :meth:`to_json`."""
        return self.to_json()

    @classmethod
    def deserialize(cls, data: str | Event) -> Event:
        """The event :meth:`serialize` wrote (an event is returned as it is)."""
        if isinstance(data, Event):
            return data
        doc = json.loads(data)
        return cls(doc["name"], EventSource[doc["source"]], doc["timestamp"], doc["metadata"])

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "source": self.source.value,
                "timestamp": self.timestamp,
                "metadata": self.metadata,
            },
            default=str,
        )


EventHandler = Callable[[Event], None]


def log_event(event: Event) -> None:
    """The default handler: one log line per event (INFO; DEBUG for the per-worker status
    events torch's agent records at the end of a run, which would crowd the console)."""
    level = logging.DEBUG if event.source is EventSource.WORKER else logging.INFO
    log.log(level, "event %s", event.to_json())


_handler: EventHandler = log_event


def configure(handler: EventHandler) -> None:
    """Send what :func:`record` is given to ``handler`` from now on."""
    global _handler
    _handler = handler


def record(event: Event, destination: str = "null") -> None:
    """Record ``event`` with the configured handler (a failing one is only logged), and,
    as torch does, as one INFO record of the logger ``torchelastic-events-<destination>``
    (which does not propagate), where a site's logging handler may be listening."""
    try:
        _handler(event)
    except Exception:
        log.exception("Event handler failed for %s", event.name)
    torch_logger(destination).info(event.serialize())


@functools.cache
def torch_logger(destination: str) -> logging.Logger:
    """torch's per-destination event logger (silent unless someone adds a handler), set
    up once per destination."""
    logger = logging.getLogger(f"torchelastic-events-{destination}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if destination == "console":
        handler: logging.Handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.NullHandler()
    logger.addHandler(handler)
    return logger


MAX_EVENT_LOG = 10 << 20
"""Bytes an event log grows to before it is rotated to ``FILE.1`` (one old file is kept)."""


class JsonLinesFile:
    """Appends events to a file, one JSON object per line, each written at once.

    Past ``max_bytes`` the file is renamed ``<path>.1`` (replacing the previous one) and a
    new one is started, so a crash-looping job's event log stays bounded. A new file that
    cannot be opened (its directory gone, no inode left) is said once, as an ERROR, and
    retried at each later event; the events lost meanwhile are counted (``lost``) and the
    count is logged when the file is back.
    """

    def __init__(self, path: str, max_bytes: int = MAX_EVENT_LOG) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._fd = -1
        self._size = 0
        self.lost = 0
        """Events dropped while the file could not be reopened."""
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def __call__(self, event: Event) -> None:
        if self._fd < 0 and not self._reopen():
            self.lost += 1
            return
        line = (event.to_json() + "\n").encode()
        try:
            if self._size and self._size + len(line) > self._max_bytes:
                self._rotate()
            self._size += os.write(self._fd, line)
        except OSError as exc:
            if self._fd < 0:  # the rotation's new file cannot be opened: said by _reopen
                self.lost += 1
                return
            from agentd.workers.output import disk_problem

            disk_problem(Path(self.path), exc)  # a full disk: one line per interval

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        try:
            os.replace(self.path, self.path + ".1")
        finally:  # rotated or not, go on writing
            self._reopen()

    def _reopen(self) -> bool:
        """Open the file again; False (said once, until it works) when it cannot be."""
        try:
            self._open()
        except OSError as exc:
            if not self.lost:
                message = (
                    "Event log %s: cannot open it again after its rotation (%s); events are "
                    "dropped and counted until it can be, tried again at each event"
                )
                log.error(message, self.path, exc.strerror)
            return False
        if self.lost:
            message = "Event log %s: open again; %d event(s) were dropped while it was not"
            log.warning(message, self.path, self.lost)
            self.lost = 0
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class AgentEvents(AgentObserver):
    """Turns an agent's hooks into events for its own sinks (an event log file, the log)."""

    def __init__(self, run_id: str, role: str, sinks: list[EventHandler]) -> None:
        self._base = {"run_id": run_id, "role": role}
        self._sinks = sinks

    def emit(self, name: str, source: EventSource = EventSource.AGENT, **metadata: Any) -> None:
        event = Event(name, source, metadata={**self._base, **metadata})
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                log.exception("Event sink %r failed for %s", sink, name)

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        self.emit("state_changed", old=old.value, new=new.value, reason=reason)

    def restarted(self, reason: str, restart_count: int) -> None:
        self.emit("restart", reason=reason, restart_count=restart_count)

    def worker_failed(self, failure: WorkerFailure) -> None:
        details = failure.to_dict()
        details.pop("traceback")
        details.pop("stderr_tail")
        self.emit("worker_failed", EventSource.WORKER, **details)

    def hang_detected(self, details: dict[str, Any]) -> None:
        self.emit("hang", **details)

    def node_excluded(self, details: dict[str, Any]) -> None:
        self.emit("node_excluded", **details)

    def node_readmitted(self) -> None:
        self.emit("node_readmitted")

    def drain_requested(self, details: dict[str, Any]) -> None:
        self.emit("drain_requested", **details)

    def drain_done(self, outcome: dict[str, Any]) -> None:
        self.emit("drain_done", **outcome)

    def straggler(self, straggler: Straggler) -> None:
        self.emit("straggler", **asdict(straggler))

    def slow_node(self, details: dict[str, Any]) -> None:
        self.emit("slow_node", **details)
