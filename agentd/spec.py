"""The domain vocabulary: worker specs, workers, worker groups, their states and results.

Names and meanings follow ``torch.distributed.elastic.agent.server.api`` so code written
against torch's agent API reads the same here.
"""

from __future__ import annotations

import enum
import re
import signal
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentd.exceptions import IllegalTransition, field_error
from agentd.restart import RestartBackoff, RestartPolicy

if TYPE_CHECKING:
    from agentd.rendezvous.api import RendezvousHandler

DEFAULT_ROLE = "default"
DEFAULT_LOG_PREFIX = "[{role}{local_rank}]:"
LOG_PREFIX_FIELDS = frozenset({"role", "local_rank", "rank", "host", "node_rank", "attempt"})
MAX_LOG_PREFIX = 256
MAX_LOCAL_WORLD_SIZE = 1024
"""Workers per agent: each costs the agent about six descriptors and a process."""
MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
NAME_RULE = (
    f"must be 1..{MAX_NAME} characters of letters, digits, '_', '.' and '-', "
    "not starting with '.' or '-'"
)
"""The rule for run ids and role names: they become directory names and label values."""


def check_name(field_name: str, value: object) -> str:
    """A run id or role name that is safe as one path component; a ConfigError otherwise
    (``../../etc``, ``a/b`` and a 5,000-character id are all refused)."""
    if not isinstance(value, str) or len(value) > MAX_NAME or not _NAME.fullmatch(value):
        raise field_error(field_name, _short(value), NAME_RULE)
    return value


def _short(value: object, size: int = 60) -> object:
    if isinstance(value, str) and len(value) > size:
        return value[: size - 3] + "..."
    return value


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


class Std(enum.IntFlag):
    """Which of a worker's standard streams a setting applies to (torchrun's 0-3)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def parse(cls, text: str, field_name: str = "redirects") -> Std | dict[int, Std]:
        """Parse torchrun's ``3`` (all ranks) or ``0:3,1:0`` (per local rank) syntax."""
        text = text.strip()
        if re.fullmatch(r"[0-3]", text):
            return cls(int(text))
        if re.fullmatch(r"\d+:[0-3](,\d+:[0-3])*", text):
            return {int(k): cls(int(v)) for k, v in (item.split(":") for item in text.split(","))}
        raise field_error(
            field_name, text, "must be 0-3 (none, stdout, stderr, both) or LOCAL_RANK:0-3,..."
        )


def std_for(setting: Std | Mapping[int, Std], local_rank: int) -> Std:
    """The setting that applies to one local rank."""
    if isinstance(setting, Std):
        return setting
    return setting.get(local_rank, Std.NONE)


def check_log_prefix(template: str) -> str:
    """Validate a tee prefix template: only the documented ``{fields}`` may appear, bare
    (no format spec or conversion: ``{rank:>99999999}`` would pad every line by 95 MB)."""
    if len(template) > MAX_LOG_PREFIX:
        raise field_error("log_line_prefix_template", _short(template),
                          f"is longer than {MAX_LOG_PREFIX} characters")  # fmt: skip
    try:
        parts = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        raise field_error(
            "log_line_prefix_template", template, f"is not a valid template ({exc})"
        ) from None
    for name, spec, conversion in parts:
        if spec or conversion:
            raise field_error("log_line_prefix_template", template,
                              f"field {{{name}}} may not have a format spec or conversion "
                              "(write the field bare, e.g. {rank})")  # fmt: skip
    names = {name for name, _, _ in parts}
    unknown = names - LOG_PREFIX_FIELDS
    if unknown:
        raise field_error(
            "log_line_prefix_template",
            template,
            f"uses unknown field(s) {sorted(unknown)}; allowed: {sorted(LOG_PREFIX_FIELDS)}",
        )
    return template


@dataclass
class WorkerSpec:
    """What to run on this host: one role, ``local_world_size`` copies of an entrypoint.

    ``entrypoint`` is an executable (``args`` follow it on the command line) or a Python
    function (called with ``*args`` in a worker subprocess; its return value lands in
    :attr:`RunResult.return_values`). ``${local_rank}`` in string args is substituted.
    """

    role: str
    local_world_size: int
    entrypoint: str | Callable[..., Any]
    args: tuple[Any, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    rdzv_handler: RendezvousHandler | None = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    master_addr: str | None = None
    master_port: int | None = None
    local_addr: str | None = None
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    log_line_prefix_template: str = DEFAULT_LOG_PREFIX
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 30.0
    restart_backoff: RestartBackoff = field(default_factory=RestartBackoff)
    non_retryable_exit_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        check_name("role", self.role)
        if (
            not isinstance(self.local_world_size, int)
            or not 1 <= self.local_world_size <= MAX_LOCAL_WORLD_SIZE
        ):
            raise field_error("local_world_size", self.local_world_size,
                              f"must be an int within 1..{MAX_LOCAL_WORLD_SIZE}")  # fmt: skip
        if isinstance(self.entrypoint, str):
            if not self.entrypoint:
                raise field_error("entrypoint", self.entrypoint, "must not be empty")
        elif not callable(self.entrypoint):
            raise field_error("entrypoint", self.entrypoint, "must be a command or a function")
        if self.max_restarts < 0:
            raise field_error("max_restarts", self.max_restarts, "must be >= 0")
        if self.monitor_interval <= 0:
            raise field_error("monitor_interval", self.monitor_interval, "must be > 0 seconds")
        if self.stop_timeout < 0:
            raise field_error("stop_timeout", self.stop_timeout, "must be >= 0 seconds")
        if self.master_port is not None and not 0 <= self.master_port <= 65535:
            raise field_error("master_port", self.master_port, "must be within 0..65535")
        self.args = tuple(self.args)
        self.stop_signal = signal.Signals(self.stop_signal)
        check_log_prefix(self.log_line_prefix_template)

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(self.max_restarts, self.restart_backoff, self.non_retryable_exit_codes)

    def get_entrypoint_name(self) -> str:
        """The entrypoint's name, for logs: a command's basename or a function's name."""
        if isinstance(self.entrypoint, str):
            name = self.entrypoint.rsplit("/", 1)[-1]
            if name.startswith("python"):  # python [-u] [-m] script: name the script
                script = next((str(a) for a in self.args if not str(a).startswith("-")), None)
                return script.rsplit("/", 1)[-1] if script else name
            return name
        return getattr(self.entrypoint, "__qualname__", repr(self.entrypoint))


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


@dataclass(frozen=True)
class WorkerFailure:
    """Why one worker failed: the facts a person needs to find the root cause.

    ``exitcode`` is negative for a death by signal (``-signum``), as in ``subprocess``.
    ``timestamp`` is the epoch time at which the agent saw the worker exit.
    """

    local_rank: int
    global_rank: int
    role: str
    pid: int
    exitcode: int
    timestamp: float
    message: str = ""
    traceback: str = ""
    stderr_tail: str = ""
    error_file: str = ""
    host: str = ""
    node_rank: int = 0

    @property
    def signal_name(self) -> str | None:
        """``SIGKILL`` and the like for a death by signal, else None."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def summary(self) -> str:
        """One line: who failed, how, and the error message if there is one."""
        how = f"signal {self.signal_name}" if self.signal_name else f"exit code {self.exitcode}"
        where = f"rank {self.global_rank} (pid {self.pid} on {self.host or 'this host'})"
        return f"{where} failed with {how}" + (f": {self.message}" if self.message else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_rank": self.local_rank,
            "rank": self.global_rank,
            "role": self.role,
            "host": self.host,
            "node_rank": self.node_rank,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "signal": self.signal_name,
            "timestamp": self.timestamp,
            "message": self.message,
            "traceback": self.traceback,
            "stderr_tail": self.stderr_tail,
            "error_file": self.error_file,
        }


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
