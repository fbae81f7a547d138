"""The worker group: its workers, the states it moves through as one unit, and the outcome
of a run (``RunResult``, ``WorkerFailure``), as ``torch.distributed.elastic`` names them.

The states are data: :data:`ALLOWED_TRANSITIONS` says which may follow which, and the one
place that changes a group's state (the agent's ``_set_state``) checks it.
"""

from __future__ import annotations

import enum
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentd.exceptions import IllegalTransition
from agentd.spec import WorkerSpec


class WorkerState(enum.StrEnum):
    """The state of a worker group; the whole local group moves as one unit."""

    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: WorkerState) -> bool:
        """True while workers may still be running: HEALTHY or UNHEALTHY."""
        return state in {WorkerState.HEALTHY, WorkerState.UNHEALTHY}


_S = WorkerState


ALLOWED_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    _S.INIT: frozenset({_S.HEALTHY, _S.FAILED, _S.STOPPED, _S.UNKNOWN}),
    _S.HEALTHY: frozenset({_S.SUCCEEDED, _S.FAILED, _S.UNHEALTHY, _S.STOPPED, _S.UNKNOWN}),
    _S.UNHEALTHY: frozenset({_S.FAILED, _S.STOPPED, _S.UNKNOWN}),
    _S.STOPPED: frozenset({_S.INIT, _S.FAILED, _S.UNKNOWN}),
    _S.FAILED: frozenset({_S.STOPPED, _S.INIT, _S.UNKNOWN}),
    _S.SUCCEEDED: frozenset({_S.UNKNOWN}),
    _S.UNKNOWN: frozenset(),
}
"""Which state may follow which. FAILED may still be stopped and restarted while retries last."""


def check_transition(old: WorkerState, new: WorkerState) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in the table."""
    if new is not old and new not in ALLOWED_TRANSITIONS[old]:
        raise IllegalTransition(f"worker group cannot move from {old.value} to {new.value}")


@dataclass
class Worker:
    """One worker of the local group: its ranks (set by rank assignment) and its pid."""

    local_rank: int
    global_rank: int = -1
    role_rank: int = -1
    world_size: int = -1
    role_world_size: int = -1
    id: int | None = None
    """The worker's pid while it runs (torch calls it ``id``)."""

    @property
    def pid(self) -> int | None:
        return self.id


@dataclass
class WorkerGroup:
    """The local workers of one role, which start, stop and restart together."""

    spec: WorkerSpec
    workers: list[Worker] = field(default_factory=list)
    store: Any = None
    group_rank: int | None = None
    group_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    state: WorkerState = WorkerState.INIT

    def __post_init__(self) -> None:
        if not self.workers:
            self.workers = [Worker(local_rank=i) for i in range(self.spec.local_world_size)]


@dataclass
class WorkerFailure:
    """Why one worker failed: the facts a person needs to find the root cause.

    The first four fields are torch's ``ProcessFailure`` (also importable under that name):
    ``exitcode`` is negative for a death by signal (``-signum``). Built with only those,
    it reads ``error_file`` as torch does: ``error_file_data`` is the document,
    ``message``, ``traceback`` and ``timestamp`` come from it. ``timestamp`` is epoch
    seconds: when the worker recorded its error, else when the agent saw it exit.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str = ""
    global_rank: int = -1
    role: str = ""
    timestamp: float = 0.0
    message: str = ""
    traceback: str = ""
    stderr_tail: str = ""
    host: str = ""
    node_rank: int = 0
    error_file_data: dict[str, Any] = field(default_factory=dict)
    hang: dict[str, Any] | None = None
    """For a hang: who went silent first, where every rank was, where the stack dumps are."""
    oom: dict[str, Any] | None = None
    """For a worker the OOM killer took: what the kernel tells of it (:mod:`agentd.reports.oom`)."""

    def __post_init__(self) -> None:
        if self.error_file and not self.error_file_data:
            from agentd.errors.error_file import read_error_file

            content = read_error_file(self.error_file)
            if content is None:
                self.error_file = ""
            else:
                self.error_file_data = content.data
                self.message = self.message or content.message
                self.traceback = self.traceback or content.traceback
                if content.timestamp:  # the worker's own word on when, as torch reads it
                    self.timestamp = int(content.timestamp)
        if not self.timestamp:
            self.timestamp = time.time()

    def signal_name(self) -> str:
        """``SIGKILL`` and the like for a death by signal, else "" (torch's method)."""
        if self.exitcode >= 0:
            return ""
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def summary(self) -> str:
        """One line: who failed, how, and the error message if there is one."""
        how = f"signal {self.signal_name()}" if self.exitcode < 0 else f"exit code {self.exitcode}"
        where = f"rank {self.global_rank} (pid {self.pid} on {self.host or 'this host'})"
        return f"{where} failed with {how}" + (f": {self.message}" if self.message else "")

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "local_rank": self.local_rank,
                "rank": self.global_rank,
                "role": self.role,
                "host": self.host,
                "node_rank": self.node_rank,
                "pid": self.pid,
                "exitcode": self.exitcode,
                "signal": self.signal_name() or None,
                "timestamp": self.timestamp,
                "message": self.message,
                "traceback": self.traceback,
                "stderr_tail": self.stderr_tail,
                "error_file": self.error_file,
            }
            | ({"hang": self.hang} if self.hang is not None else {})
            | ({"oom": self.oom} if self.oom is not None else {})
        )


@dataclass
class RunResult:
    """The outcome of a run or of one monitoring step.

    ``return_values`` and ``failures`` are keyed by global rank; the root cause is the
    failure with the earliest timestamp.
    """

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, WorkerFailure] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED

    @property
    def root_cause(self) -> WorkerFailure | None:
        if not self.failures:
            return None
        return min(self.failures.values(), key=lambda f: (f.timestamp, f.global_rank))
