"""What a worker group is asked to run: the ``WorkerSpec``, its log specs and the rules its
fields obey (names, log prefixes, start methods). The group itself, its states and a run's
outcome are in :mod:`agentd.group`.

Names and meanings follow ``torch.distributed.elastic.agent.server.api`` so code written
against torch's agent API reads the same here.
"""

from __future__ import annotations

import enum
import math
import re
import signal
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentd.exceptions import field_error
from agentd.restart_policy import RestartBackoff, RestartPolicy

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


def is_module_name(name: object) -> bool:
    """Whether ``name`` is a dotted module name (``torch``, ``torch.nn``)."""
    return isinstance(name, str) and all(part.isidentifier() for part in name.split("."))


def check_module_names(field_name: str, names: object) -> tuple[str, ...]:
    """Dotted module names (``torch``, ``torch.nn``); a ConfigError naming the first that
    is not one."""
    if isinstance(names, str) or not isinstance(names, tuple | list):
        raise field_error(field_name, _short(names), "must be a list of module names")
    for name in names:
        if not is_module_name(name):
            raise field_error(
                field_name,
                _short(name),
                "is not a module name (dotted Python identifiers, such as torch or torch.nn)",
            )
    return tuple(names)


def _short(value: object, size: int = 60) -> object:
    if isinstance(value, str) and len(value) > size:
        return value[: size - 3] + "..."
    return value


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


START_METHODS = ("spawn", "fork", "forkserver")


def check_start_method(value: object) -> str:
    """torch's ``start_method`` for function entrypoints. Every one of them runs as
    ``spawn`` here: forking the agent's process (an event loop, threads) is not safe."""
    if value not in START_METHODS:
        raise field_error("start_method", value, f"must be one of {', '.join(START_METHODS)}")
    return str(value)


def std_for(setting: Std | Mapping[int, Std], local_rank: int) -> Std:
    """The setting that applies to one local rank."""
    if isinstance(setting, Std):
        return setting
    return setting.get(local_rank, Std.NONE)


_TORCH_PREFIX_FIELDS = {"role_name": "role", "rank": "rank", "local_rank": "local_rank"}


def from_torch_prefix(template: str) -> str:
    """torch's ``${role_name}``/``${rank}``/``${local_rank}`` template in agentd's syntax."""

    def field(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in _TORCH_PREFIX_FIELDS:
            raise field_error(
                "log_line_prefix_template",
                template,
                f"uses unknown field ${{{name}}}; torch's are "
                + ", ".join(f"${{{n}}}" for n in _TORCH_PREFIX_FIELDS),
            )
        return "{" + _TORCH_PREFIX_FIELDS[name] + "}"

    if "$" not in template:
        return template
    escaped = template.replace("{", "{{").replace("}", "}}")
    return re.sub(r"\$\{\{(\w+)\}\}", field, escaped)


def check_log_prefix(template: str) -> str:
    """Validate a tee prefix template: only the documented ``{fields}`` may appear, bare
    (no format spec or conversion: ``{rank:>99999999}`` would pad every line by 95 MB).
    torch's ``${rank}`` syntax is accepted too; returns the template in agentd's syntax."""
    if len(template) > MAX_LOG_PREFIX:
        raise field_error(
            "log_line_prefix_template",
            _short(template),
            f"is longer than {MAX_LOG_PREFIX} characters",
        )
    template = from_torch_prefix(template)
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
            raise field_error(
                "log_line_prefix_template",
                template,
                f"field {{{name}}} may not have a format spec or conversion "
                "(write the field bare, e.g. {rank})",
            )
    names = {name for name, _, _ in parts}
    unknown = names - LOG_PREFIX_FIELDS
    if unknown:
        raise field_error(
            "log_line_prefix_template",
            template,
            f"uses unknown field(s) {sorted(unknown)}; allowed: {sorted(LOG_PREFIX_FIELDS)}",
        )
    return template


def check_picklable_function(function: Callable[..., Any]) -> None:
    """A function entrypoint must reach a spawned worker by reference (module and name),
    as with torch's ``spawn`` start method: a lambda or a nested function cannot."""
    import pickle

    try:
        pickle.dumps(function)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        name = getattr(function, "__qualname__", repr(function))
        raise field_error(
            "entrypoint",
            name,
            "must be a function defined at the top level of a module (workers "
            f"are spawned and get it by reference; {exc})",
        ) from None


@dataclass
class WorkerSpec:
    """What to run on this host: one role, ``local_world_size`` copies of an entrypoint.

    The fields up to ``event_log_handler`` are torch's, in torch's order and defaults;
    agentd's own follow (pass them by keyword). ``entrypoint`` is an executable (``args``
    follow it on the command line) or a Python function, called with ``*args`` in a
    spawned worker process as torch's ``spawn`` start method does (its return value lands
    in :attr:`RunResult.return_values`); ``fn`` is torch's deprecated name for a function
    entrypoint. ``${local_rank}`` in string args is substituted. Without an
    ``rdzv_handler`` the group runs alone on this host under a fresh run id.
    ``master_addr``/``master_port`` pin the workers' store; ``local_addr`` is this host's
    address, the master address when none is pinned and this node is group rank 0.
    """

    role: str
    local_world_size: int
    rdzv_handler: RendezvousHandler | None = None
    fn: Callable[..., Any] | None = None
    entrypoint: str | Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    max_restarts: int = 3
    monitor_interval: float = 0.1
    master_port: int | None = None
    master_addr: str | None = None
    local_addr: str | None = None
    event_log_handler: str = "null"
    env: Mapping[str, str] = field(default_factory=dict)
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    log_line_prefix_template: str = DEFAULT_LOG_PREFIX
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 30.0
    restart_backoff: RestartBackoff = field(default_factory=RestartBackoff)
    non_retryable_exit_codes: frozenset[int] = frozenset()
    virtual_local_rank: bool = False
    """torch's: every worker sees LOCAL_RANK=0 and only its own GPU."""
    duplicate_stdout_filters: list[str] | None = None
    """torch's: stdout lines containing any of these also go to the attempt's
    ``filtered_stdout.log`` (prefixed as tee'd lines are)."""
    duplicate_stderr_filters: list[str] | None = None
    preload: tuple[str, ...] | None = None
    """Modules a zygote imports once, to fork every worker from (warm restarts; see
    :mod:`agentd.preload`). None spawns each worker; ``()`` spawns the first attempt's and
    forks later attempts' from a bare zygote, started with the first workers."""
    preload_reason: str = ""
    """Why ``preload`` is what it is (``agentd run``'s choice), for the agent's start line."""
    standby_workers: int | None = None
    """Workers the zygote keeps forked ahead, so a lost rank's replacement costs no fork
    (:mod:`agentd.preload.spare`). None: one per local rank where the group may restart,
    none where it may not."""
    standby_cuda: bool = False
    """Each standby initialises CUDA and makes a context on its local rank's device while
    it waits (torch preloaded; :mod:`agentd.preload.warm_cuda`)."""
    numa_options: Any = None
    """torch's NUMA binding of the workers, which agentd does not do: only None is taken
    (``agentd run --numa-binding`` is refused the same way)."""

    def __post_init__(self) -> None:
        check_name("role", self.role)
        if self.numa_options is not None:
            raise field_error(
                "numa_options", self.numa_options, "must be None: NUMA binding is not supported"
            )
        if (
            not isinstance(self.local_world_size, int)
            or not 1 <= self.local_world_size <= MAX_LOCAL_WORLD_SIZE
        ):
            raise field_error(
                "local_world_size",
                self.local_world_size,
                f"must be an int within 1..{MAX_LOCAL_WORLD_SIZE}",
            )
        if self.fn is not None:
            import warnings

            warnings.warn(
                "WorkerSpec.fn is deprecated, use WorkerSpec.entrypoint",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.entrypoint is None:
                self.entrypoint = self.fn
        if self.entrypoint is None:
            raise field_error("entrypoint", None, "is required (a command or a function)")
        if isinstance(self.entrypoint, str):
            if not self.entrypoint:
                raise field_error("entrypoint", self.entrypoint, "must not be empty")
        elif not callable(self.entrypoint):
            raise field_error("entrypoint", self.entrypoint, "must be a command or a function")
        else:
            check_picklable_function(self.entrypoint)
        if self.max_restarts < 0:
            raise field_error("max_restarts", self.max_restarts, "must be >= 0")
        # written so that nan fails too (every comparison with it is false)
        if not 0 < self.monitor_interval < math.inf:
            raise field_error("monitor_interval", self.monitor_interval, "must be > 0 seconds")
        if not 0 <= self.stop_timeout < math.inf:
            raise field_error("stop_timeout", self.stop_timeout, "must be >= 0 seconds, finite")
        if self.master_port is not None and not 0 <= self.master_port <= 65535:
            raise field_error("master_port", self.master_port, "must be within 0..65535")
        if self.preload is not None:
            self.preload = check_module_names("preload", self.preload)
        self._check_standbys()
        self.args = tuple(self.args)
        self.stop_signal = signal.Signals(self.stop_signal)
        self.log_line_prefix_template = check_log_prefix(self.log_line_prefix_template)

    def _check_standbys(self) -> None:
        count = self.standby_workers
        if count is not None and (type(count) is not int or not 0 <= count <= MAX_LOCAL_WORLD_SIZE):
            raise field_error(
                "standby_workers", count, f"must be None or an int within 0..{MAX_LOCAL_WORLD_SIZE}"
            )
        if (count or self.standby_cuda) and self.preload is None:
            field = "standby_workers" if count else "standby_cuda"
            value = count if count else self.standby_cuda
            raise field_error(
                field, value, "needs a zygote (preload not None): spawned workers have no standbys"
            )
        if self.standby_cuda and "torch" not in (self.preload or ()):
            raise field_error(
                "standby_cuda",
                True,
                f"needs torch among the preloaded modules (preload {self.preload})",
            )
        if self.standby_cuda and self.virtual_local_rank:
            raise field_error(
                "standby_cuda",
                True,
                "cannot be combined with virtual_local_rank: each worker's CUDA_VISIBLE_DEVICES "
                "differs, and a standby's CUDA was initialised under the zygote's",
            )

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(self.max_restarts, self.restart_backoff, self.non_retryable_exit_codes)

    @property
    def keeps_log_files(self) -> bool:
        """Whether some worker's output goes to its log files (``redirects`` or ``tee``)."""
        ranks = range(self.local_world_size)
        return any(std_for(self.redirects, r) | std_for(self.tee, r) for r in ranks)

    def how_started(self) -> str:
        """How the workers start, for the start line: spawned, or forked from what preload."""
        why = f" ({self.preload_reason})" if self.preload_reason else ""
        if self.preload is None:
            return f"workers spawned{why}"
        if not self.preload:
            return f"first workers spawned, restarts forked from a bare zygote{why}"
        return f"workers forked from a zygote preloading {', '.join(self.preload)}{why}"

    @property
    def preload_is_auto(self) -> bool:
        """``--preload auto`` chose :attr:`preload` (see :attr:`preload_reason`)."""
        return self.preload_reason.startswith("auto:")

    def get_entrypoint_name(self) -> str:
        """The entrypoint's name, for logs: a command's basename or a function's name."""
        if isinstance(self.entrypoint, str):
            name = self.entrypoint.rsplit("/", 1)[-1]
            if name.startswith("python"):  # python [-u] [-m] script: name the script
                script = next((str(a) for a in self.args if not str(a).startswith("-")), None)
                return script.rsplit("/", 1)[-1] if script else name
            return name
        return getattr(self.entrypoint, "__qualname__", repr(self.entrypoint))
