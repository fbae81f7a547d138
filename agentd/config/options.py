"""The option table of ``agentd run``: each setting declared once, with its flags, parser,
default and help.

:mod:`agentd.config.resolve` resolves the table into an
:class:`~agentd.config.resolve.AgentConfig`; the CLI's flags and the example config
(``config/agentd.toml``) are generated from it. The values' parsers are in
:mod:`agentd.config.values`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentd.config import values as v
from agentd.spec import DEFAULT_LOG_PREFIX, DEFAULT_ROLE, START_METHODS

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
    repeatable: bool = False
    """The flag may be given more than once; the values are joined with commas."""

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
    repeatable: bool = False,
) -> Option:
    dashed = "--" + name.replace("_", "-")
    flags = [dashed] + (["--" + name] if "_" in name else []) + list(extra)
    return Option(name, tuple(flags), parse, default, help, is_flag, metavar, torch_env, repeatable)


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
        v.optional_host,
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
        "local_addr", v.optional_host, "", "This node's address for the rendezvous.", metavar="ADDR"
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
        "initial_heartbeat_timeout",
        v.optional_seconds,
        "",
        "Seconds a worker may run before its first heartbeat (agentd.heartbeat()); given, "
        "it also holds workers that never heartbeat (default: 600, once any worker "
        "heartbeats).",
        metavar="SECONDS",
    ),
    _o(
        "heartbeat_timeout",
        v.optional_seconds,
        "",
        "Seconds between two heartbeats before a worker counts as hung (default: learned "
        "from the intervals seen).",
        metavar="SECONDS",
    ),
    _o(
        "section_timeout",
        v.section_timeouts,
        "",
        "Timeout of a named section (agentd.section(NAME)), NAME=SECONDS; repeat the flag "
        "or list them with commas (default: learned).",
        metavar="NAME=SECONDS",
        repeatable=True,
    ),
    _o(
        "heartbeat_safety_factor",
        v.number(1.0),
        "2",
        "A learned timeout is the 99th percentile of the intervals seen times this factor.",
        metavar="FACTOR",
    ),
    _o(
        "heartbeat_min_timeout",
        v.number(0.0, strict=True),
        "2",
        "A learned timeout is never shorter than this many seconds.",
        metavar="SECONDS",
    ),
    _o(
        "straggler_factor",
        v.number(1.0, strict=True),
        "1.5",
        "A rank whose step takes this many times the other local ranks' median is slow.",
        metavar="FACTOR",
    ),
    _o(
        "straggler_steps",
        v.integer(1),
        "20",
        "Steps a rank must stay slow before it is reported as a straggler.",
        metavar="N",
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
        v.host,
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
