"""The ``agentd`` command line: parse, resolve the config, run, map outcomes to exit codes.

Exit codes: 0 succeeded; 1 the worker group failed; 2 usage or configuration error;
3 could not start; 4 this host failed its node checks too often; 5 drained while no other
node ran the job (it ended unfinished); 128+N stopped by signal N.
Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentd import __version__
from agentd.config.build import scheduler_line, worker_spec
from agentd.config.option import Parser, unknown_variables
from agentd.config.resolve import OPTIONS, AgentConfig, check_script, config_file_from, resolve
from agentd.config.values import RuleError, host
from agentd.exceptions import AgentdError, AgentStopped, ConfigError
from agentd.group import WorkerState
from agentd.spec import WorkerSpec
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls

log = logging.getLogger("agentd")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="agentd", description="An asyncio elastic agent for training jobs.")
    parser.add_argument("--version", action="version", version=f"agentd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    run = commands.add_parser(
        "run",
        help="run a training script's workers on this host (torchrun's flags)",
        description="Run SCRIPT's workers on this host as a worker group, with torchrun's "
        "flags and worker contract.",
        epilog="Each option is also read from AGENTD_<NAME> and then torchrun's PET_<NAME> "
        "(e.g. AGENTD_NPROC_PER_NODE, PET_NNODES), and some from torch's own variables, as "
        "listed; the command line wins. Precedence: flag > AGENTD_* > PET_* > torch's "
        "variable > --config file > default.",
        argument_default=argparse.SUPPRESS,
    )
    run.add_argument("--config", metavar="FILE", help="TOML file of options (see config/)")
    for option in OPTIONS:
        kwargs: dict[str, Any] = {
            "dest": option.name,
            "help": f"{option.help} [env {', '.join(option.env_names)}; "
            f"default {option.default!r}]",
        }
        if option.is_flag:
            kwargs["action"] = "store_true"
        elif option.repeatable:
            kwargs["action"] = "append"
            kwargs["metavar"] = option.metavar
        else:
            kwargs["metavar"] = option.metavar
        run.add_argument(*option.flags, **kwargs)
    run.add_argument(
        "--no-preload",
        dest="preload",
        action="store_const",
        const="off",
        help="spawn every worker (turns off a --preload from the environment or the --config file)",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="check all, print the options resolved, start none"
    )
    run.add_argument(
        "script", nargs="?", metavar="SCRIPT", help="training script, module (-m) or executable"
    )
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    status = commands.add_parser(
        "status",
        help="show a running agent's status (its --health-port endpoint)",
        description="Ask a running agent for its status; exit 0 ok, 1 unhealthy, 3 unreachable.",
    )
    _endpoint_arguments(
        status,
        "the agent's health endpoint: a URL, host:port or a local port (default: "
        "AGENTD_STATUS_URL, else http://127.0.0.1:$AGENTD_HEALTH_PORT or :29401)",
        3.0,
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument(
        "--job",
        nargs="?",
        const="",
        metavar="URL",
        help="the whole job: every node of the round, from any agent's health endpoint "
        "(URL, else as --url)",
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="with --job: redraw in place every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument(
        "--check",
        choices=("livez", "readyz"),
        help="only probe /livez or /readyz (for exec probes)",
    )
    drain = commands.add_parser(
        "drain",
        help="drain a running agent's node (its --health-port endpoint)",
        description="Ask a running agent to drain its node: every rank of the job checkpoints "
        "at the same step, then the job goes on without this node (a static job waits for "
        "a node in its place). Exit 0 draining, 1 refused, 3 unreachable.",
    )
    _endpoint_arguments(drain, "the agent's health endpoint (as for agentd status)", 10.0)
    drain.add_argument("--reason", help="why (shown in the logs, /status and events)")
    logs = commands.add_parser(
        "logs",
        help="every node's worker output, merged in time order (needs --tee or --redirects)",
        description="Print the ranks' output of every node of the job, merged in time order, "
        "each line prefixed host:rank and the attempt. Exit 0, 1 an agent refused, 3 "
        "unreachable.",
    )
    _endpoint_arguments(logs, "any agent's health endpoint (as for agentd status)", 10.0)
    logs.add_argument("-f", "--follow", action="store_true", help="go on printing new lines")
    logs.add_argument("--rank", type=int, help="only this global rank's lines")
    logs.add_argument("--node", help="only this node's (its group rank, host or node id)")
    logs.add_argument("--since", help="only lines from this long ago on: 90s, 10m, 2h, 1d")
    logs.add_argument("--dir", help="read a run's log folder, not agents (after the job)")
    store = commands.add_parser(
        "store",
        help="run the rendezvous store server on its own",
        description="Serve the key-value store agents rendezvous through (HTTP, in memory).",
    )
    store.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    store.add_argument("--port", type=int, default=29400, help="port (default 29400; 0: any)")
    store.add_argument(
        "--store-token",
        help="bearer token clients must send; required off "
        "loopback (prefer AGENTD_STORE_TOKEN: flags show in ps)",
    )
    store.add_argument(
        "--peers",
        default="",
        metavar="HOST:PORT,...",
        help="every candidate store, in order, this one (--host:--port) among "
        "them: one serves, the others stand by to take over (the agents' "
        "--rdzv-endpoint lists the same)",
    )
    store.add_argument("--cert", help="serve over TLS with this PEM certificate (and --key)")
    store.add_argument("--key", help="the PEM private key of --cert (if not in that file)")
    store.add_argument(
        "--cacert",
        help="require clients to present a certificate signed by this PEM CA (mutual TLS); "
        "candidates verify each other against it",
    )
    store.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio"),
        help="its event loop (default auto: uvloop's where installed, else asyncio's)",
    )
    store.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
    return parser


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> AgentConfig:
    cli = {k: v for k, v in vars(args).items() if k != "command"}
    if cli.get("script") is None:
        cli.pop("script", None)
    return resolve(cli, environ, config_file_from(cli, environ))


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


async def run_agent(config: AgentConfig, spec: WorkerSpec) -> int:
    """Run one agent to completion; returns the exit code."""
    import asyncio

    from agentd.config.build import local_agent
    from agentd.support.child_signals import STOP_SIGNALS, ignore_in_children
    from agentd.support.ratelog import rate_limited_loop_errors
    from agentd.workers.env import SIGNALS_ENV

    agent = local_agent(config, spec)
    agent.add_observer(CollectOnceRunning())
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(rate_limited_loop_errors())
    os.environ[SIGNALS_ENV] = ",".join(sig.name for sig in config.signals_to_handle)
    handled = {*config.signals_to_handle, *config.drain_on}
    stops = {*STOP_SIGNALS, *config.signals_to_handle, spec.stop_signal}
    ignore_in_children(sig for sig in config.drain_on if sig not in stops)
    for sig in config.signals_to_handle:
        loop.add_signal_handler(sig, agent.request_stop, sig)
    for sig in config.drain_on:  # these drain instead
        loop.add_signal_handler(sig, agent.request_drain, f"signal {sig.name}", sig)
    try:
        result = await agent.run_async(spec.role)
    except AgentStopped as exc:
        log.warning("Agent %s; workers stopped", exc)
        return exc.exit_code
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        gc.enable()  # a start that never reached HEALTHY
    if result.is_failed():
        log.error("%s", agent.failure_report())
        if agent.result_written:
            log.error("Failure report written to %s", agent.result_file.path)
        from agentd.errors.error_file import copy_error_file

        root = result.root_cause
        if root is not None and copy_error_file(root.error_file):  # for a launcher above us
            log.info("Root cause's error file copied to $TORCHELASTIC_ERROR_FILE")
        return EXIT_FAILED
    return EXIT_OK


class CollectOnceRunning(AgentObserver):
    """Garbage collection waits for the workers: the agent's start allocates long-lived
    objects only (modules, classes, the config), so the ~50 collections it would trigger
    find nothing and delay the first worker. Once the group is HEALTHY, those objects are
    frozen out of every later collection and collection resumes."""

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        if new is WorkerState.HEALTHY and not gc.isenabled():
            gc.freeze()
            gc.enable()


def run_store(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """``agentd store``: validate, then serve until a stop signal."""
    from agentd.store.serve import peers_from_flag, served_tls
    from agentd.store.server import StoreServer
    from agentd.support import fast_loop

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: {args.port!r} must be within 0..65535")
    try:
        args.host = host(args.host)
    except RuleError as exc:
        raise ConfigError(f"--host: {args.host!r} {exc}") from None
    token = args.store_token or environ.get("AGENTD_STORE_TOKEN") or None
    tls = served_tls(args.cacert, args.cert, args.key)
    StoreServer(args.host, args.port, token, tls=tls)  # every rule is checked before binding
    peers, index = peers_from_flag(args.peers, args.host, args.port, token)
    setup_logging("text", args.log_level)
    if tls is None:
        from agentd.store.tls import warn_clear_token

        warn_clear_token([args.host], "serve it with --cert and --key (and --cacert)")
    try:
        return fast_loop.run(serve_store(args.host, args.port, token, peers, index, tls), args.loop)
    except AgentdError as exc:
        log.error("%s", exc)
        return exc.exit_code


async def serve_store(
    host: str,
    port: int,
    token: str | None,
    peers: list[str],
    index: int | None,
    tls: StoreTls | None,
) -> int:
    """Serve the store; one that makes its own token publishes it in a file, which a
    guardian removes if the store is killed (SIGKILL, out of memory)."""
    from agentd.hygiene.guardian import guarded_secrets
    from agentd.store.serve import serve

    if token is not None:
        return await serve(host, port, token, peers, index, tls)
    async with guarded_secrets("store"):
        return await serve(host, port, token, peers, index, tls)


def _endpoint_arguments(command: argparse.ArgumentParser, url_help: str, timeout: float) -> None:
    """The ways a command names the agent it asks (URL, ``--url`` or ``--health-port``),
    how long it waits and the CA of an ``https://`` endpoint."""
    command.add_argument("url_arg", nargs="?", metavar="URL", help="the same as --url")
    command.add_argument("--url", help=url_help)
    command.add_argument("--health-port", metavar="PORT", help="this host's agent on this port")
    command.add_argument(
        "--timeout", type=float, default=timeout, help=f"seconds to wait (default {timeout:g})"
    )
    command.add_argument(
        "--cacert",
        help="the CA that signed an https:// endpoint's certificate (--health-cert; default: "
        "AGENTD_HEALTH_CACERT, else the system's CAs)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    gc.disable()  # until the workers run (CollectOnceRunning); other commands: below
    parser = build_parser()
    environ = dict(os.environ)
    try:
        args = parser.parse_args(argv)
        if args.command != "run":
            gc.enable()
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        if args.command != "run":  # run logs them once its logging is set
            for line in unknown_variables(environ, OPTIONS):
                print(f"agentd: warning: {line}", file=sys.stderr)
        if args.command in ("status", "drain"):
            from agentd.support.agent_url import read_endpoints

            read_endpoints(args)
        if args.command == "status":
            from agentd.health import status_cli

            return status_cli.run(
                args.url, args.json, args.check, args.timeout, args.cacert, args.job, args.watch
            )
        if args.command == "store":
            return run_store(args, environ)
        if args.command == "logs":
            from agentd.joblogs import cli as logs_cli

            return logs_cli.run(args)
        if args.command == "drain":
            from agentd.drain import http as drain_http

            return drain_http.run(args.url, args.reason, args.timeout, args.cacert)
        config = config_from_args(args, environ)
        check_script(config)
        setup_logging(config.log_format, config.log_level)
        for line in unknown_variables(environ, OPTIONS):
            log.warning("%s", line)
        if config.detected is not None:
            log.info("%s", scheduler_line(config))
        try:
            spec = worker_spec(config)  # everything is checked before anything starts
        except ConfigError as exc:  # a part names its field: say it as the user gave it
            raise ConfigError(config.as_given(str(exc))) from None
        if getattr(args, "dry_run", False):
            from agentd.config.dry_run import dry_run_text

            sys.stdout.write(dry_run_text(config, spec))
            return EXIT_OK
    except ConfigError as exc:
        gc.enable()
        print(f"agentd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import asyncio  # here, not at the top: its import runs without collections too

    try:
        code = asyncio.run(run_agent(config, spec))
    except AgentdError as exc:
        log.log(
            logging.INFO if exc.exit_code == 0 else logging.ERROR, "%s", config.as_given(str(exc))
        )
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    log.debug("agentd exiting with %d after %.3fs", code, time.monotonic() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
