"""AgentConfig: every setting of ``agentd run``, resolved once, in one place.

Each option is declared once in :data:`OPTIONS`; the CLI flags, the environment variables
(``AGENTD_<NAME>``, then torchrun's ``PET_<NAME>``), the TOML keys (``--config FILE``) and
the example config all come from that table; the values' parsers are in
:mod:`agentd.config_values`. Precedence: CLI flag > ``AGENTD_*`` > ``PET_*`` > torch's
variable (``Option.torch_env``) > TOML file > default. Every problem is a
:class:`ConfigError` naming where the value came from, the value, and the rule it broke.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentd import config_values as v
from agentd.exceptions import ConfigError
from agentd.restart import RestartBackoff
from agentd.spec import (
    DEFAULT_LOG_PREFIX,
    DEFAULT_ROLE,
    MAX_LOCAL_WORLD_SIZE,
    START_METHODS,
    Std,
)

ENV_PREFIXES = ("AGENTD_", "PET_")
RDZV_BACKENDS = ("static", "agentd", "c10d", "etcd", "etcd-v2")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# -- the option table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting: its field name (also the TOML key), its flags, parser and default."""

    name: str
    flags: tuple[str, ...]
    parse: Callable[[str], Any]
    default: str
    help: str
    is_flag: bool = False
    metavar: str | None = None
    torch_env: str | tuple[str, ...] | None = None
    """torch variables that also set this option, after ``AGENTD_*`` and ``PET_*``."""

    @property
    def env_names(self) -> tuple[str, ...]:
        names = tuple(prefix + self.name.upper() for prefix in ENV_PREFIXES)
        extra = (self.torch_env,) if isinstance(self.torch_env, str) else self.torch_env or ()
        return (*names, *extra)


def _o(
    name: str,
    parse: Callable[[str], Any],
    default: str,
    help: str,
    *extra: str,
    is_flag: bool = False,
    metavar: str | None = None,
    torch_env: str | tuple[str, ...] | None = None,
) -> Option:
    dashed = "--" + name.replace("_", "-")
    flags = [dashed] + (["--" + name] if "_" in name else []) + list(extra)
    return Option(name, tuple(flags), parse, default, help, is_flag, metavar, torch_env)


OPTIONS: tuple[Option, ...] = (
    _o(
        "nnodes",
        v.parse_nnodes,
        "1",
        "Number of nodes, N or MIN:MAX (elastic, with --rdzv-backend agentd or etcd).",
        metavar="N",
    ),
    _o(
        "nproc_per_node",
        v.nproc,
        "1",
        "Workers on this host: an integer, auto, cpu or gpu.",
        metavar="N",
    ),
    _o(
        "standalone",
        v.boolean,
        "false",
        "Single-node job with a local rendezvous (torchrun's).",
        is_flag=True,
    ),
    _o(
        "rdzv_backend",
        v.choice(RDZV_BACKENDS),
        "static",
        "Rendezvous backend: static, agentd (alias c10d: the embedded store) or etcd "
        "(alias etcd-v2: an etcd v3 cluster).",
        metavar="NAME",
    ),
    _o(
        "rdzv_endpoint",
        v.text,
        "",
        "The rendezvous store, host:port (the agent on that host serves it), or candidate "
        "stores host:port,host:port,... (one serves, the others take over); for etcd, its "
        "members, host:port[,host:port...].",
        metavar="HOST:PORT",
    ),
    _o(
        "rdzv_id",
        v.optional_run_name,
        "",
        "Run id shared by the job's agents, 1..128 of [A-Za-z0-9_.-] (default: random).",
        metavar="ID",
    ),
    _o(
        "rdzv_conf",
        v.text,
        "",
        "Rendezvous settings, key=value,...: join_timeout, last_call_timeout, "
        "close_timeout, keep_alive_interval, keep_alive_max_attempt, read_timeout; is_host "
        "(agentd); protocol, cacert, cert, key, username, password, key_prefix (etcd).",
        metavar="CONF",
    ),
    _o(
        "store_token",
        v.optional_text,
        "",
        "Bearer token of the rendezvous store; required to serve it off loopback "
        "(prefer the variable: flags show in ps).",
        metavar="TOKEN",
    ),
    _o("node_rank", v.integer(0), "0", "This node's rank for the static rendezvous.", metavar="N"),
    _o(
        "max_restarts",
        v.integer(0),
        "0",
        "Restarts of the worker group before the job fails.",
        metavar="N",
    ),
    _o(
        "monitor_interval",
        v.number(0.0, strict=True),
        "0.1",
        "Accepted for torchrun's command lines; agentd watches, it never polls.",
        metavar="SECONDS",
    ),
    _o("role", v.run_name, DEFAULT_ROLE, "The workers' role name.", metavar="ROLE"),
    _o(
        "log_dir",
        v.optional_text,
        "",
        "Directory for worker logs, error files and result.json "
        "(default: a new temporary directory).",
        metavar="DIR",
    ),
    _o(
        "keep_attempts",
        v.integer(0, 1_000_000),
        "10",
        "Attempt log directories kept: the first and the last N (0: all of them).",
        metavar="N",
    ),
    _o(
        "redirects",
        v.std_setting("redirects"),
        "0",
        "Send worker streams to log files only: 0-3 or LOCAL_RANK:0-3,...",
        "-r",
        metavar="STD",
    ),
    _o(
        "tee",
        v.std_setting("tee"),
        "0",
        "Send worker streams to log files and, prefixed, to the console.",
        "-t",
        metavar="STD",
    ),
    _o(
        "local_ranks_filter",
        v.ranks,
        "",
        "Show only these local ranks' output on the console.",
        metavar="RANKS",
    ),
    _o(
        "module",
        v.boolean,
        "false",
        "Run the script as a Python module (python -m).",
        "-m",
        is_flag=True,
    ),
    _o(
        "no_python",
        v.boolean,
        "false",
        "Run the script as an executable, not with python.",
        is_flag=True,
    ),
    _o(
        "run_path",
        v.boolean,
        "false",
        "torchrun's runpy.run_path mode; agentd runs the script as python -u script either "
        "way (same __main__, argv and sys.path).",
        is_flag=True,
    ),
    _o(
        "start_method",
        v.choice(START_METHODS),
        "spawn",
        "torchrun's start method for function entrypoints (all run as spawn here).",
        metavar="METHOD",
    ),
    _o(
        "logs_specs",
        v.logs_specs,
        "",
        "torchrun.logs_specs entry point name; only the default layout is supported.",
        metavar="NAME",
    ),
    _o(
        "event_log_handler",
        v.choice(("null", "console")),
        "null",
        "torch's event destination: null, or console (events on stderr as JSON).",
        metavar="NAME",
    ),
    _o(
        "numa_binding",
        v.unsupported(
            "NUMA binding is not supported by agentd; bind in the entrypoint, "
            "e.g. --no-python numactl --cpunodebind=N python train.py"
        ),
        "",
        "torchrun's NUMA binding: refused with an explanation (not supported).",
        metavar="MODE",
    ),
    _o(
        "duplicate_stdout_filters",
        v.filters,
        "",
        "Also copy stdout lines containing any of these words (a,b; ',,' is a comma) to "
        "attempt_<n>/filtered_stdout.log.",
        metavar="FILTERS",
    ),
    _o(
        "duplicate_stderr_filters",
        v.filters,
        "",
        "The same for stderr lines, to attempt_<n>/filtered_stderr.log.",
        metavar="FILTERS",
    ),
    _o(
        "virtual_local_rank",
        v.boolean,
        "false",
        "Every worker sees LOCAL_RANK=0 and only its own GPU (CUDA_VISIBLE_DEVICES).",
        is_flag=True,
    ),
    _o(
        "preload",
        v.preload,
        "off",
        "Warm restarts: a zygote imports these modules once (comma-separated, e.g. torch; "
        "empty: only the interpreter) and forks every worker from them; 'off' spawns "
        "each worker (--no-preload).",
        metavar="MODULES",
    ),
    _o(
        "master_addr",
        v.optional_text,
        "",
        "Address of group rank 0 for the workers' own "
        "process group (default 127.0.0.1 on a single node).",
        metavar="ADDR",
    ),
    _o(
        "master_port",
        v.integer(0, 65535),
        "0",
        "Port for the workers' process group (default: a free port every attempt).",
        metavar="PORT",
    ),
    _o(
        "local_addr", v.optional_text, "", "This node's address for the rendezvous.", metavar="ADDR"
    ),
    _o(
        "stop_signal",
        v.parse_signal,
        "SIGTERM",
        "Signal that asks workers to stop.",
        metavar="SIGNAL",
    ),
    _o(
        "stop_timeout",
        v.number(0.0),
        "30",
        "Seconds from the stop signal to SIGKILL.",
        "--shutdown-timeout",
        "--shutdown_timeout",
        metavar="SECONDS",
        torch_env=("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
    ),
    _o(
        "restart_backoff",
        v.backoff,
        "0",
        "Delay between restarts: INITIAL[:MAX[:FACTOR"
        "[:JITTER]]] seconds, exponential (0 restarts at once).",
        metavar="SPEC",
    ),
    _o(
        "non_retryable_exit_codes",
        v.exit_codes,
        "",
        "Worker exit codes that fail the job without a restart, e.g. 2,3.",
        metavar="CODES",
    ),
    _o(
        "signals_to_handle",
        v.signals,
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "Signals that stop the workers gracefully; the agent exits 128+N.",
        metavar="SIGNALS",
    ),
    _o(
        "exit_barrier_timeout",
        v.number(0.0),
        "300",
        "Seconds to wait for the other nodes' workers after ours succeed.",
        metavar="SECONDS",
    ),
    _o(
        "log_line_prefix_template",
        v.log_prefix,
        DEFAULT_LOG_PREFIX,
        "Prefix of tee'd lines: {role} {local_rank} {rank} {host} {node_rank} {attempt} "
        "(or torch's ${role_name} ${rank} ${local_rank}).",
        metavar="TEMPLATE",
        torch_env="TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    ),
    _o(
        "file_timer",
        v.boolean,
        "false",
        "Serve torch's named-pipe timer protocol to the workers "
        "(FileTimerClient, agentd.timer.expires).",
        is_flag=True,
        torch_env="TORCHELASTIC_ENABLE_FILE_TIMER",
    ),
    _o(
        "timer_file",
        v.optional_text,
        "",
        "Path of the timer pipe (default: a private one; workers get it as "
        "TORCHELASTIC_TIMER_FILE).",
        metavar="PATH",
        torch_env="TORCHELASTIC_TIMER_FILE",
    ),
    _o(
        "timer_dump_signal",
        v.optional_signal,
        "",
        "Signal sent to a worker whose timer expired, before the kill "
        "(e.g. SIGUSR1 for faulthandler stack dumps).",
        metavar="SIGNAL",
    ),
    _o(
        "timer_dump_grace",
        v.number(0.0),
        "1",
        "Seconds between the dump signal and the kill.",
        metavar="SECONDS",
    ),
    _o(
        "uninterruptible_timeout",
        v.number(0.0),
        "0",
        "Restart the group when a worker stays this many seconds in D state (0: off).",
        metavar="SECONDS",
        torch_env="TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT",
    ),
    _o(
        "health_port",
        v.optional_port,
        "",
        "Serve /livez /readyz /status /metrics on this port (0: any free port; empty: off).",
        metavar="PORT",
        torch_env="TORCHELASTIC_HEALTH_CHECK_PORT",
    ),
    _o(
        "health_host",
        v.text,
        "127.0.0.1",
        "Address of the health endpoint (0.0.0.0 for probes from outside the host).",
        metavar="HOST",
    ),
    _o(
        "health_timeout",
        v.number(0.0, strict=True),
        "5",
        "Seconds the watchdog may be overdue, or the event loop late, before /livez fails.",
        metavar="SECONDS",
    ),
    _o(
        "event_log",
        v.optional_text,
        "",
        "Append the run's events (state changes, restarts, failures) to this file as JSON lines.",
        metavar="FILE",
    ),
    _o(
        "log_format",
        v.choice(LOG_FORMATS),
        "text",
        "The agent's own log format: text or json.",
        metavar="FORMAT",
    ),
    _o(
        "log_level",
        v.choice(LOG_LEVELS, upper=True),
        "INFO",
        "The agent's log level.",
        metavar="LEVEL",
    ),
)
OPTIONS_BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class AgentConfig:
    """The resolved settings of one ``agentd run``; field meanings are in :data:`OPTIONS`."""

    script: str
    script_args: tuple[str, ...] = ()
    nnodes: tuple[int, int] = (1, 1)
    nproc_per_node: str = "1"
    standalone: bool = False
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = ""
    rdzv_conf: str = ""
    store_token: str | None = None
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
    preload: tuple[str, ...] | None = None
    master_addr: str | None = None
    master_port: int = 0
    local_addr: str | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 30.0
    restart_backoff: RestartBackoff = field(default_factory=RestartBackoff)
    non_retryable_exit_codes: frozenset[int] = frozenset()
    signals_to_handle: tuple[signal.Signals, ...] = (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )
    exit_barrier_timeout: float = 300.0
    log_line_prefix_template: str = DEFAULT_LOG_PREFIX
    file_timer: bool = False
    timer_file: str | None = None
    timer_dump_signal: signal.Signals | None = None
    timer_dump_grace: float = 1.0
    uninterruptible_timeout: float = 0.0
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    health_timeout: float = 5.0
    event_log: str | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each explicitly set value came from (a flag, a variable or the file)."""


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_toml_text(v) for v in value)
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
    return {key.replace("-", "_"): value for key, value in data.items()}


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
            key = sorted(unknown)[0]
            raise ConfigError(f"{config_file}: {key} is not a known option (see agentd run --help)")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        raw, source = _pick(option, cli, environ, file_values, config_file)
        try:
            values[option.name] = option.parse(raw)
        except v.RuleError as exc:
            raise ConfigError(f"{source}: {raw!r} {exc}") from None
        if source != "default":
            sources[option.name] = source
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
    if values["preload"] is not None and values["no_python"]:
        raise ConfigError("--preload: needs a Python script or module; --no-python runs an "
                          "executable (use --no-preload)")  # fmt: skip
    return AgentConfig(script=script, script_args=tuple(args), sources=sources, **values)


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
        return ("true" if value is True else str(value)), option.flags[0]
    for env_name in option.env_names:
        if env_name in environ:
            return environ[env_name], env_name
    if option.name in file_values:
        where = f"{config_file}: {option.name}"
        try:
            return _toml_text(file_values[option.name]), where
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
        raise ConfigError(f"--nproc-per-node: {nproc!r} means {count} workers, more than "
                          f"{MAX_LOCAL_WORLD_SIZE}; give a number")  # fmt: skip
    return count


def example_toml() -> str:
    """The documented example config, generated from :data:`OPTIONS` (see config/)."""
    lines = [
        "# agentd run configuration. Every key is optional; precedence is",
        "# CLI flag > AGENTD_<KEY> > PET_<KEY> > this file > default.",
        "# Keys accept dashes or underscores. Values below are the defaults.",
        "",
        "# The job: the training script and its arguments (the command line overrides both).",
        '# script = "train.py"',
        '# args = ["--epochs", "10"]',
        "",
    ]
    for option in OPTIONS:
        lines.append(f"# {option.help} ({', '.join(option.flags)})")
        lines.append(f"# {option.name} = {_toml_literal(option)}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _toml_literal(option: Option) -> str:
    value = option.parse(option.default)
    if option.is_flag or type(value) in (int, float):
        return option.default
    return '"' + option.default.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_script(config: AgentConfig, cwd: str | None = None) -> None:
    """Fail before anything starts when the script, module or executable is not there."""
    import shutil

    cwd = cwd or os.getcwd()
    script = config.script
    if config.no_python:
        if os.sep in script:
            if not os.access(os.path.join(cwd, script), os.X_OK):
                raise ConfigError(f"script: {script!r} is not an executable file")
        elif shutil.which(script) is None:
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
        raise ConfigError(f"script: {script!r} is a directory; give a Python file, or a "
                          "module with --module")  # fmt: skip
    if not Path(cwd, script).is_file():
        raise ConfigError(f"script: {script!r} does not exist")


if __name__ == "__main__":
    # Regenerates config/agentd.toml: python -m agentd.config > config/agentd.toml
    sys.stdout.write(example_toml())
