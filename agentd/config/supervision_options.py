"""The options that watch and stop a job: the stop policy and restarts, the watchdog
(timers, D-state), hang detection (heartbeats, stragglers), health and logging. Part of the
option table (:mod:`agentd.config.options`)."""

from __future__ import annotations

from agentd.config import values as v
from agentd.config.option import LOG_FORMATS, LOG_LEVELS, Option
from agentd.config.option import option as _o
from agentd.spec import DEFAULT_LOG_PREFIX

SUPERVISION_OPTIONS: tuple[Option, ...] = (
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
        "drain_on",
        v.optional_signals,
        "",
        "Signals that drain this node instead of stopping it: every rank of the job "
        "checkpoints at the same step, the job goes on without this node (a static job: "
        "waits for a node in its place), which exits 128+N (e.g. SIGTERM for a preemption "
        "notice; a second signal stops it as a stop signal does).",
        metavar="SIGNALS",
    ),
    _o(
        "drain_timeout",
        v.number(0.0),
        "60",
        "Seconds a draining node waits for every rank's step and checkpoint, in all, "
        "before it leaves.",
        metavar="SECONDS",
    ),
    _o(
        "inprocess_park_timeout",
        v.number(0.0),
        "10",
        "Seconds the surviving ranks of an in-process restart (agentd.inprocess.run) have to "
        "leave their training function; a rank that has not by then restarts as a new "
        "process, the others keep theirs.",
        metavar="SECONDS",
    ),
    _o(
        "inprocess_quick_restarts",
        v.integer(0),
        "3",
        "In-process restarts in a row, each within 60 s of the last, after which the next "
        "restart uses new processes for every rank (0: no limit).",
        metavar="N",
    ),
    _o(
        "gpu_release_timeout",
        v.number(0.0),
        "30",
        "Seconds a restart's new workers wait, from the stop while the next round forms, "
        "until the stopped ones hold no memory on this node's GPUs, or what they hold fits "
        "in what those GPUs have free (read through NVML or nvidia-smi; 0: no wait).",
        metavar="SECONDS",
    ),
    _o(
        "checkpoint_signal",
        v.optional_signal,
        "",
        "Also send this signal to every worker when a drain starts (default: none; workers "
        "ask agentd.checkpoint_requested()).",
        metavar="SIGNAL",
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
        "resume_heartbeat_timeout",
        v.optional_seconds,
        "",
        "Seconds a rank resumed in process may run before its first heartbeat (default: "
        "learned from the time new workers take to their first heartbeat, at least 30).",
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
        "straggler_interval",
        v.number(0.0),
        "5",
        "Seconds between two store requests of the job-wide straggler comparison: each "
        "node's compute sections against the other nodes' (0: off; docs/hangs.md).",
        metavar="SECONDS",
    ),
    _o(
        "replace_stragglers",
        v.boolean,
        "false",
        "Drain a node named slower than the others when a spare agent waits, so the spare "
        "takes its place (every rank checkpoints at one step).",
        is_flag=True,
    ),
    _o(
        "node_check",
        v.node_checks,
        "",
        "A check this host must pass to join the job, and keep passing while its workers run "
        "(repeat the flag; one per line in the variable): a shell command (exit 0 passes), "
        "builtin:disk[=SIZE] (free space for the logs, default 1GiB), builtin:gpus[=N] "
        "(nvidia-smi lists N GPUs, default one per worker; skipped without nvidia-smi) or "
        "builtin:store (the rendezvous endpoint accepts a connection).",
        metavar="CHECK",
        repeatable=True,
        separator="\n",
    ),
    _o(
        "node_check_interval",
        v.number(0.0),
        "30",
        "Seconds between two node checks while the workers run (0: only before joining).",
        metavar="SECONDS",
    ),
    _o(
        "node_check_cooldown",
        v.number(0.0),
        "10",
        "Seconds a host that failed its node checks stays out before checking again, "
        "doubled with each exclusion (up to 16 times).",
        metavar="SECONDS",
    ),
    _o(
        "node_check_max_exclusions",
        v.integer(0),
        "5",
        "Exclusions within an hour a host tolerates; the next one makes the agent give up "
        "(exit code 4). 0: never give up.",
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
        "health_cert",
        v.optional_text,
        "",
        "Serve the health endpoint over TLS with this certificate (PEM; with --health-key).",
        metavar="PATH",
    ),
    _o(
        "health_key",
        v.optional_text,
        "",
        "The private key of --health-cert (PEM).",
        metavar="PATH",
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
