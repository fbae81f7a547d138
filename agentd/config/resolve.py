"""AgentConfig: every setting of ``agentd run``, resolved once, in one place.

Each option is declared once in :data:`agentd.config.options.OPTIONS`; the CLI flags,
the environment variables (``AGENTD_<NAME>``, then torchrun's ``PET_<NAME>``), the TOML
keys (``--config FILE``) and the example config all come from that table; the values' parsers are in
:mod:`agentd.config.values`. Precedence: CLI flag > ``AGENTD_*`` > ``PET_*`` > torch's
variable (``Option.torch_env``) > TOML file > the scheduler's environment
(``--scheduler``, :mod:`agentd.schedulers`) > default. Every problem is a
:class:`ConfigError` naming where the value came from, the value, and the rule it broke.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from agentd.config import values as v
from agentd.config.option import Option
from agentd.config.options import OPTIONS, OPTIONS_BY_NAME
from agentd.exceptions import ConfigError
from agentd.restart_policy import RestartBackoff
from agentd.spec import (
    DEFAULT_LOG_PREFIX,
    DEFAULT_ROLE,
    MAX_LOCAL_WORLD_SIZE,
    Std,
)

if TYPE_CHECKING:
    from agentd.schedulers.detected import Detected


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class AgentConfig:
    """The resolved settings of one ``agentd run``; field meanings are in :data:`OPTIONS`.

    Built with keywords (``script`` is required), frozen, equal when every field but
    ``sources`` and ``detected`` is. A plain class, not a dataclass: Python compiles a
    dataclass's generated methods at every start, 4.8 ms for these 80 fields (0.03 ms
    for this class; ``docs/architecture.md``).
    """

    script: str
    script_args: tuple[str, ...] = ()
    scheduler: str = "auto"
    nnodes: tuple[int, int] = (1, 1)
    nproc_per_node: str = "1"
    standalone: bool = False
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = ""
    rdzv_conf: str = ""
    store_token: str | None = None
    drain_token: str | None = None
    health_cert: str | None = None
    health_key: str | None = None
    node_rank: int = 0
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = DEFAULT_ROLE
    log_dir: str | None = None
    keep_attempts: int = 10
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    start_method: str = "spawn"
    logs_specs: str = ""
    event_log_handler: str = "null"
    numa_binding: str = ""
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    virtual_local_rank: bool = False
    preload: tuple[str, ...] | Literal["auto"] | None = "auto"
    standby_workers: int | None = None
    standby_cuda: bool = False
    master_addr: str | None = None
    master_port: int = 0
    local_addr: str | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 30.0
    restart_backoff: RestartBackoff = RestartBackoff()
    non_retryable_exit_codes: frozenset[int] = frozenset()
    signals_to_handle: tuple[signal.Signals, ...] = (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )
    drain_on: tuple[signal.Signals, ...] = ()
    drain_timeout: float = 60.0
    inprocess_park_timeout: float = 10.0
    inprocess_quick_restarts: int = 3
    gpu_release_timeout: float = 30.0
    checkpoint_signal: signal.Signals | None = None
    exit_barrier_timeout: float = 300.0
    log_line_prefix_template: str = DEFAULT_LOG_PREFIX
    file_timer: bool = False
    timer_file: str | None = None
    timer_dump_signal: signal.Signals | None = None
    timer_dump_grace: float = 1.0
    uninterruptible_timeout: float = 0.0
    initial_heartbeat_timeout: float | None = None
    heartbeat_timeout: float | None = None
    resume_heartbeat_timeout: float | None = None
    section_timeout: Mapping[str, float] = _EMPTY
    heartbeat_safety_factor: float = 2.0
    heartbeat_min_timeout: float = 2.0
    straggler_factor: float = 1.5
    straggler_steps: int = 20
    straggler_interval: float = 5.0
    replace_stragglers: bool = False
    node_check: tuple[str, ...] = ()
    node_check_interval: float = 30.0
    node_check_cooldown: float = 10.0
    node_check_max_exclusions: int = 5
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    health_timeout: float = 5.0
    event_log: str | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    sources: Mapping[str, str] = _EMPTY
    """Where each value not left to its default came from (a flag, a variable, the file
    or the scheduler)."""
    given: Mapping[str, str] = _EMPTY
    """The text each of those values was given as (what a config file may say again)."""
    detected: Detected | None = None
    """What the scheduler's environment said (None: no scheduler was read)."""

    def __init__(self, **values: Any) -> None:
        unknown = values.keys() - _FIELDS.keys()
        if unknown:
            raise TypeError(f"AgentConfig: unknown field(s) {', '.join(sorted(unknown))}")
        if "script" not in values:
            raise TypeError("AgentConfig: script is required")
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"AgentConfig is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"AgentConfig is frozen: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not AgentConfig:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _FIELDS if n not in _UNCOMPARED)

    __hash__ = None  # type: ignore[assignment]

    def as_given(self, message: str) -> str:
        """``message`` with a leading option field (``log_dir: ...``, as the agent's parts
        name it) said as the user gave the option: its flag, variable or config file key
        (the option's flag where the default was used)."""
        field, sep, rest = message.partition(": ")
        option = OPTIONS_BY_NAME.get(field) if sep else None
        if option is None:
            return message
        return f"{self.sources.get(field, option.flags[0])}: {rest}"

    def __repr__(self) -> str:
        return f"AgentConfig({', '.join(f'{n}={getattr(self, n)!r}' for n in _FIELDS)})"


_FIELDS = dict.fromkeys(AgentConfig.__annotations__)
"""The fields, in the order they are declared."""
_UNCOMPARED = frozenset({"sources", "given", "detected"})


_PAIRS = frozenset({"rdzv_conf"})
"""Options of ``key=value,...`` pairs: in a config file, a table is one too."""


def _toml_text(value: Any, separator: str = ",", pairs: bool = False) -> str:
    if pairs and isinstance(value, dict):
        return ",".join(f"{key}={_toml_text(item)}" for key, item in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return separator.join(_toml_text(v) for v in value)
    if isinstance(value, int | float | str):
        return str(value)
    raise v.RuleError("must be a string, number, boolean or list")


def read_toml(path: str) -> dict[str, Any]:
    """Read a config file: flat keys named as the options (dashes or underscores)."""
    import tomllib  # only when a file is given: it is slow to import

    try:
        with open(path, "rb") as fp:
            data = tomllib.load(fp)
    except FileNotFoundError:
        raise ConfigError(f"--config: {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--config: {path!r} cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path!r} is not valid TOML ({exc})") from None
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in values:  # the TOML is valid, but one of the two would be dropped unseen
            first = next(k for k in data if k.replace("-", "_") == name)
            raise ConfigError(f"{path}: {key} and {first} are one option: give it once")
        values[name] = value
    return values


def resolve(
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    config_file: str | None = None,
) -> AgentConfig:
    """Build the config from CLI values (only those given), the environment and a TOML file.

    ``cli`` holds raw strings (or True for flags) keyed by option name, plus ``script`` and
    ``script_args``. The file's ``script`` and ``args`` keys describe the job when the
    command line does not.
    """
    file_values: dict[str, Any] = {}
    if config_file:
        file_values = read_toml(config_file)
        unknown = set(file_values) - set(OPTIONS_BY_NAME) - {"script", "args"}
        if unknown:
            import difflib

            key = sorted(unknown)[0]
            names = sorted({*OPTIONS_BY_NAME, "script", "args"})
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.8)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"{config_file}: {key} is not a known option ({hint}see agentd run --help)"
            )
    picks = {o.name: _pick(o, cli, environ, file_values, config_file) for o in OPTIONS}
    detected = _detect(picks, environ)
    if detected is not None:
        for name, raw in detected.values.items():
            if picks[name][1] == "default":
                picks[name] = (raw, detected.source(name))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given: dict[str, str] = {}
    for option in OPTIONS:
        raw, source = picks[option.name]
        try:
            values[option.name] = option.parse(raw)
        except v.RuleError as exc:
            raise ConfigError(f"{source}: {raw!r} {exc}") from None
        if source != "default":
            sources[option.name], given[option.name] = source, raw
    # The file's job is checked even when the command line names its own: a broken file
    # must not pass unseen until the day someone runs it without arguments.
    file_script = file_values.get("script")
    if file_script is not None and (not isinstance(file_script, str) or not file_script):
        raise ConfigError(f"{config_file}: script: {file_script!r} must be a non-empty string")
    file_args = file_values.get("args", [])
    if not isinstance(file_args, list) or not all(isinstance(a, str) for a in file_args):
        raise ConfigError(f"{config_file}: args: {file_args!r} must be a list of strings")
    script = cli.get("script") or file_script
    if not script:
        raise ConfigError("script: missing; give the training script (or set script in --config)")
    args = cli.get("script_args", []) if cli.get("script") else file_args
    if values["module"] and values["no_python"]:
        raise ConfigError("--module: cannot be combined with --no-python")
    if isinstance(values["preload"], tuple) and values["no_python"]:
        raise ConfigError(
            "--preload: needs a Python script or module; --no-python runs an "
            "executable (use --no-preload)"
        )
    return AgentConfig(
        script=script,
        script_args=tuple(args),
        sources=sources,
        given=given,
        detected=detected,
        **values,
    )


def _detect(picks: Mapping[str, tuple[str, str]], environ: Mapping[str, str]) -> Detected | None:
    """What ``--scheduler`` reads from the environment, given the options the user set."""
    from agentd.schedulers import detect

    raw, source = picks["scheduler"]
    try:
        choice = OPTIONS_BY_NAME["scheduler"].parse(raw)
    except v.RuleError as exc:
        raise ConfigError(f"{source}: {raw!r} {exc}") from None
    given = {name: raw for name, (raw, source) in picks.items() if source != "default"}
    return detect(choice, environ, given)


def _pick(
    option: Option,
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, Any],
    config_file: str | None,
) -> tuple[str, str]:
    """The raw text of an option and the name of its source, by precedence."""
    if option.name in cli:
        value = cli[option.name]
        if isinstance(value, list):  # a repeatable flag
            return option.separator.join(map(str, value)), option.flags[0]
        return ("true" if value is True else str(value)), option.flags[0]
    for env_name in option.env_names:
        if env_name in environ:
            return environ[env_name], env_name
    if option.name in file_values:
        where = f"{config_file}: {option.name}"
        try:
            value = file_values[option.name]
            return _toml_text(value, option.separator, option.name in _PAIRS), where
        except v.RuleError as exc:
            raise ConfigError(f"{where}: {file_values[option.name]!r} {exc}") from None
    return option.default, "default"


def config_file_from(cli: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """``--config`` or else ``AGENTD_CONFIG``."""
    return cli.get("config") or environ.get("AGENTD_CONFIG") or None


def gpu_count(environ: Mapping[str, str] = os.environ) -> int:
    """NVIDIA GPUs visible to workers, without importing torch."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def local_world_size(nproc: str, environ: Mapping[str, str] = os.environ) -> int:
    """Resolve ``--nproc-per-node`` (int, auto, cpu, gpu) to a number of workers."""
    if nproc.isdigit():
        return int(nproc)
    cpus = len(os.sched_getaffinity(0))
    gpus = gpu_count(environ)
    if nproc == "gpu" and gpus == 0:
        raise ConfigError("--nproc-per-node: 'gpu' needs a visible GPU and none was found")
    count = cpus if nproc == "cpu" or not gpus else gpus
    if count > MAX_LOCAL_WORLD_SIZE:
        raise ConfigError(
            f"--nproc-per-node: {nproc!r} means {count} workers, more than "
            f"{MAX_LOCAL_WORLD_SIZE}; give a number"
        )
    return count


def check_script(config: AgentConfig, cwd: str | None = None) -> None:
    """Fail before anything starts when the script, module or executable is not there."""
    cwd = cwd or os.getcwd()
    script = config.script
    if config.no_python:
        if os.sep in script:
            if not os.access(os.path.join(cwd, script), os.X_OK):
                raise ConfigError(f"script: {script!r} is not an executable file")
            return
        import shutil  # only here: it is slow to import

        if shutil.which(script) is None:
            raise ConfigError(f"script: {script!r} is not on PATH")
        return
    if config.module:
        from importlib.machinery import PathFinder

        top = script.split(".")[0]
        found = top in sys.builtin_module_names or PathFinder.find_spec(top, [cwd, *sys.path])
        if not found:
            raise ConfigError(f"--module: {script!r} cannot be found (no module named {top!r})")
        return
    if Path(cwd, script).is_dir():
        if Path(cwd, script, "__main__.py").is_file():
            return  # python runs a directory by its __main__.py, under torchrun too
        raise ConfigError(
            f"script: {script!r} is a directory without a __main__.py; give a Python file, "
            "such a directory, or a module with --module"
        )
    if not Path(cwd, script).is_file():
        raise ConfigError(f"script: {script!r} does not exist")
