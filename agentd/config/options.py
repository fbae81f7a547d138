"""The option table of ``agentd run``: each setting declared once, with its flags, parser,
default and help. This module holds the job's options (nodes, rendezvous, workers, logs,
launch); :mod:`agentd.config.supervision_options` those that watch and stop it.

:mod:`agentd.config.resolve` resolves the table into an
:class:`~agentd.config.resolve.AgentConfig`; the CLI's flags and the example config
(``config/agentd.toml``) are generated from it. The values' parsers are in
:mod:`agentd.config.values`.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentd.config import values as v
from agentd.config.option import RDZV_BACKENDS, Option
from agentd.config.option import option as _o
from agentd.config.supervision_options import SUPERVISION_OPTIONS
from agentd.schedulers import SCHEDULERS
from agentd.spec import DEFAULT_ROLE, START_METHODS

JOB_OPTIONS: tuple[Option, ...] = (
    _o(
        "scheduler",
        v.choice(SCHEDULERS),
        "auto",
        "Read the job's shape from its scheduler: auto (Slurm when SLURM_JOB_ID is set, "
        "Kubernetes in an Indexed Job's pod), slurm, kubernetes or none; any option given "
        "wins over what is read (docs/schedulers.md).",
        metavar="NAME",
    ),
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
        "members, host:port[,host:port...]; for static, where the workers meet (in place of "
        "--master-addr and --master-port, as torchrun's).",
        metavar="HOST:PORT",
    ),
    _o(
        "rdzv_id",
        v.optional_run_name,
        "",
        "Run id shared by the job's agents, 1..128 of [A-Za-z0-9_.-] (default: torchrun's "
        "'none' where the agents meet in a store, so give each job that shares one its own; "
        "a random id for --standalone and static jobs).",
        metavar="ID",
    ),
    _o(
        "rdzv_conf",
        v.text,
        "",
        "Rendezvous settings, key=value,...: join_timeout, last_call_timeout, "
        "close_timeout, keep_alive_interval, keep_alive_max_attempt, read_timeout; is_host, "
        "standby (agentd); protocol, cacert, cert, key (TLS: agentd and etcd); username, "
        "password, key_prefix (etcd); timeout (static: the wait for node 0 and every "
        "node, 600 s).",
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
    _o(
        "drain_token",
        v.optional_text,
        "",
        "Bearer token of POST /drain on the health port (never the store's); without it "
        "the agent makes one, readable by its user only beside the store's token (prefer "
        "the variable: flags show in ps).",
        metavar="TOKEN",
    ),
    _o(
        "node_rank",
        v.integer(0),
        "0",
        "This node's rank for the static rendezvous, 0..N-1, each node its own (node 0's "
        "agent serves the job's store).",
        metavar="N",
    ),
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
        "Directory for worker logs, error files and result.json, and the store host's "
        "last round, kept across its restart (default: a new temporary directory; the "
        "last round then in $TMPDIR/agentd-<uid>).",
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
        "torchrun.logs_specs entry point: a LogsSpecs class that places the workers' logs.",
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
        "auto",
        "Fast starts and restarts: a zygote imports these modules once (comma-separated, "
        "e.g. torch) and forks every worker from them (empty: the first workers are "
        "spawned, restarts forked); 'auto' preloads torch, numpy, Lightning and "
        "transformers when the script imports them, and nothing when it imports none "
        "(docs/preload.md); 'off' "
        "spawns each worker (--no-preload).",
        metavar="MODULES",
    ),
    _o(
        "standby_workers",
        v.standby_count,
        "auto",
        "Workers the zygote keeps forked ahead, each parked until a lost rank's "
        "replacement is needed (no fork on the restart's path); 'auto' keeps one per "
        "local rank where the job may restart, none where it may not (docs/inprocess.md).",
        metavar="N",
    ),
    _o(
        "standby_cuda",
        v.boolean,
        "false",
        "Each standby worker initialises CUDA and makes a context on its local rank's "
        "device (cuda:LOCAL_RANK, modulo the devices visible) while it waits, about 0.5 "
        "GiB of GPU memory each; the survivors' state then reaches it by CUDA IPC where "
        "they share its GPU (AGENTD_SYNC_ROUTE=cuda-ipc unless set); needs torch preloaded "
        "(docs/inprocess.md#standby-workers).",
        is_flag=True,
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
)

OPTIONS: tuple[Option, ...] = (*JOB_OPTIONS, *SUPERVISION_OPTIONS)
OPTIONS_BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}
