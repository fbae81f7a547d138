"""From a resolved :class:`~agentd.config.resolve.AgentConfig` to what runs: the
``WorkerSpec`` with its rendezvous handler, and the local agent with each feature's
settings. Everything is checked here, before anything starts; ``agentd run`` calls both
(torch's ``elastic_launch`` builds its spec from its own ``LaunchConfig``, in
:mod:`agentd.launcher`)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from agentd.config.resolve import AgentConfig, local_world_size
from agentd.exceptions import ConfigError
from agentd.spec import WorkerSpec

if TYPE_CHECKING:
    from agentd.agent.local import LocalElasticAgent
    from agentd.drain.settings import DrainSettings
    from agentd.health.settings import HealthSettings
    from agentd.heartbeats.settings import HeartbeatSettings
    from agentd.inprocess.settings import InProcessSettings
    from agentd.nodecheck.gate import NodeGate
    from agentd.slownodes.settings import SlowNodeSettings

log = logging.getLogger(__name__)


MAYBE_UNUSED = (
    *("master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "local_ranks_filter"),
    *("timer_file", "health_host", "health_timeout", "health_cert", "health_key", "drain_token"),
    *("node_check_interval", "node_check_cooldown", "node_check_max_exclusions"),
)
"""Options that may be given and not used here (:mod:`agentd.config.unheeded` says which; it
is loaded only where one of them was given)."""


def _meets_in_a_store(config: AgentConfig) -> bool:
    """Whether the agents meet in a store (a rendezvous store, or node 0's under a static
    job of several nodes), where the run id is what they share: without ``--rdzv-id`` they
    take torchrun's default, so each does not form a job of its own. A standalone job, or
    a static one of one node, meets nobody, and gets an id of its own."""
    if config.standalone:
        return False
    return config.rdzv_backend != "static" or config.nnodes[0] > 1


def _default_run_id(config: AgentConfig) -> str:
    """Without ``--rdzv-id``: torchrun's shared default where the agents meet in a store,
    else an id of this agent's own."""
    if not _meets_in_a_store(config):
        return os.urandom(6).hex()
    from agentd.rendezvous.keys import SHARED_RUN_ID

    return SHARED_RUN_ID


def _run_folder(config: AgentConfig) -> str | None:
    """A run under the shared default id gets a folder of its own, as under torchrun (None:
    the run id names it); a run named by ``--rdzv-id`` keeps one across agent restarts."""
    if config.rdzv_id or not _meets_in_a_store(config):
        return None
    return f"{_default_run_id(config)}_{os.urandom(4).hex()}"


def worker_spec(config: AgentConfig) -> WorkerSpec:
    """The WorkerSpec and its rendezvous for a resolved config (checks everything)."""
    from agentd.rendezvous.build import RendezvousRequest, build_rendezvous

    run_id = config.rdzv_id or _default_run_id(config)
    nproc = local_world_size(config.nproc_per_node)
    request = RendezvousRequest(
        nnodes=config.nnodes,
        rdzv_backend=config.rdzv_backend,
        rdzv_endpoint=config.rdzv_endpoint,
        rdzv_conf=config.rdzv_conf,
        standalone=config.standalone,
        node_rank=config.node_rank,
        local_addr=config.local_addr,
        master_addr=config.master_addr,
        master_port=config.master_port,
        role=config.role,
        store_token=config.store_token,
        log_dir=config.log_dir,
    )
    rdzv = build_rendezvous(request, run_id, nproc)
    static = rdzv.get_backend() == "static"
    meets = static and bool(config.rdzv_endpoint)  # as torchrun: the endpoint names the master
    if any(name in config.sources for name in MAYBE_UNUSED):
        from agentd.config.unheeded import say_what_is_unheeded

        say_what_is_unheeded(config, rdzv.get_backend(), nproc)
    if config.no_python:
        entrypoint, args = config.script, list(config.script_args)
    else:
        entrypoint = sys.executable
        args = ["-u", *(["-m"] if config.module else []), config.script, *config.script_args]
    preload, preload_reason = _preload(config)
    env = {}
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        env["OMP_NUM_THREADS"] = "1"
    standby_cuda = _standby_cuda(config, preload, preload_reason)
    if standby_cuda and "AGENTD_SYNC_ROUTE" not in os.environ:  # handover.ROUTE_ENV, unloaded
        env["AGENTD_SYNC_ROUTE"] = "cuda-ipc"  # 176 ms, not 378 by the group (docs/inprocess.md)
    return WorkerSpec(
        role=config.role,
        local_world_size=nproc,
        entrypoint=entrypoint,
        args=tuple(args),
        env=env,
        rdzv_handler=rdzv,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=config.master_addr if static and not meets else None,
        master_port=None if meets else config.master_port or None,
        local_addr=config.local_addr,
        redirects=config.redirects,
        tee=config.tee,
        local_ranks_filter=config.local_ranks_filter,
        log_line_prefix_template=config.log_line_prefix_template,
        stop_signal=config.stop_signal,
        stop_timeout=config.stop_timeout,
        restart_backoff=config.restart_backoff,
        non_retryable_exit_codes=config.non_retryable_exit_codes,
        event_log_handler=config.event_log_handler,
        virtual_local_rank=config.virtual_local_rank,
        preload=preload,
        preload_reason=preload_reason,
        standby_workers=config.standby_workers,
        standby_cuda=standby_cuda,
        duplicate_stdout_filters=list(config.duplicate_stdout_filters) or None,
        duplicate_stderr_filters=list(config.duplicate_stderr_filters) or None,
    )


def _preload(config: AgentConfig) -> tuple[tuple[str, ...] | None, str]:
    """The modules the zygote preloads (None: spawn) and why, for the agent's start line."""
    if config.preload != "auto":
        return config.preload, "--preload off" if config.preload is None else "--preload"
    if config.no_python:
        return None, "auto: --no-python runs an executable"
    from agentd.preload.auto import choose

    chosen = choose("module" if config.module else "script", config.script)
    return chosen.modules, f"auto: {chosen.reason}"


def _standby_cuda(config: AgentConfig, preload: tuple[str, ...] | None, why: str) -> bool:
    """``--standby-cuda`` as the spec takes it, once both standby options are checked
    against the preload chosen (``preload``, for the reason ``why``)."""
    if preload is None and config.standby_workers:
        raise ConfigError(
            f"--standby-workers: {config.standby_workers} needs a zygote to fork them "
            f"from, and the workers are spawned ({why})"
        )
    if not config.standby_cuda:
        return False
    if preload is None or "torch" not in preload:
        modules = "off" if preload is None else ",".join(preload) or "nothing"
        raise ConfigError(
            "--standby-cuda: needs torch preloaded (--preload torch); the preload is "
            f"{modules} ({why})"
        )
    if config.virtual_local_rank:
        raise ConfigError(
            "--standby-cuda: cannot be combined with --virtual-local-rank (each worker's "
            "CUDA_VISIBLE_DEVICES differs from the one a standby initialised CUDA under)"
        )
    return True


SCHEDULED = (
    "nnodes",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "local_addr",
    "nproc_per_node",
    "drain_on",
)
"""The options a scheduler's environment may set (the start line says which the user set)."""


def scheduler_line(config: AgentConfig) -> str:
    """One line of what the scheduler's environment gave, as the agent uses it:
    ``Slurm job 1234: 4 nodes (1:4), endpoint node01:2345, candidates
    node01,node02,node03, 8 workers per node, this node node02``."""
    from agentd.config.options import OPTIONS_BY_NAME

    detected = config.detected
    assert detected is not None
    low, high = config.nnodes
    nodes = f"{high} node{'s' if high > 1 else ''}" + (f" ({low}:{high})" if low != high else "")
    parts = [nodes]
    if config.rdzv_backend != "static" and config.rdzv_endpoint and not config.standalone:
        endpoints = config.rdzv_endpoint.split(",")
        parts.append(f"endpoint {endpoints[0]}")
        if len(endpoints) > 1:
            hosts = [e.strip().rsplit(":", 1)[0] for e in endpoints]
            parts.append(f"candidates {','.join(hosts)}")
        elif config.rdzv_backend in ("agentd", "c10d"):
            parts.append("candidates: members as they stand by (no store token)")
    workers = config.nproc_per_node
    parts.append(f"{workers} worker{'' if workers == '1' else 's'} per node")
    if config.local_addr:
        parts.append(f"this node {config.local_addr}")
    if config.drain_on:
        parts.append("drain on " + ",".join(sig.name for sig in config.drain_on))
    line = f"{detected.job}: {', '.join(parts)}"
    given = [
        OPTIONS_BY_NAME[name].flags[0]
        for name in SCHEDULED
        if name in config.sources and not config.sources[name].startswith(detected.scheduler)
    ]
    return line + (f" (given: {', '.join(given)})" if given else "")


def local_agent(config: AgentConfig, spec: WorkerSpec) -> LocalElasticAgent:
    """The local agent that runs ``spec`` with ``config``'s settings (each feature gets its
    own settings object, never the whole config)."""
    from agentd.agent.local import LocalElasticAgent
    from agentd.assembly.settings import AgentSettings
    from agentd.timer.settings import WatchdogSettings

    settings = AgentSettings(
        keep_attempts=config.keep_attempts,
        fresh_run_id=not config.rdzv_id and not _meets_in_a_store(config),
        run_folder=_run_folder(config),
        watchdog=WatchdogSettings(
            file_timer=config.file_timer,
            timer_file=config.timer_file,
            dump_signal=config.timer_dump_signal,
            dump_grace=config.timer_dump_grace,
            uninterruptible_timeout=config.uninterruptible_timeout,
        ),
        health=_health(config),
        event_log=config.event_log,
        heartbeats=_heartbeats(config),
        node_checks=_node_gate(config, spec) if config.node_check else None,
        drain=_drain(config),
        inprocess=_inprocess(config),
        gpu_release_timeout=config.gpu_release_timeout,
        slow_nodes=_slow_nodes(config, spec),
        torch_env=False,  # resolved above, as the flags' defaults
    )
    return LocalElasticAgent(
        spec,
        logs_specs_from(config) if config.logs_specs else None,
        exit_barrier_timeout=config.exit_barrier_timeout,
        log_dir=config.log_dir,
        settings=settings,
    )


LOGS_SPECS_GROUP = "torchrun.logs_specs"


def logs_specs_from(config: AgentConfig) -> Any:
    """``--logs-specs NAME``: the class the installed entry point ``NAME`` of
    :data:`LOGS_SPECS_GROUP` names, made with the output options as torchrun makes it
    (a subclass of torch's or agentd's ``LogsSpecs``)."""
    from importlib.metadata import entry_points

    found = {point.name: point for point in entry_points(group=LOGS_SPECS_GROUP)}
    point = found.get(config.logs_specs)
    if point is None:
        names = ", ".join(sorted(found)) or "none"
        raise ConfigError(
            f"--logs-specs: {config.logs_specs!r} is not an entry point of "
            f"{LOGS_SPECS_GROUP} (installed: {names})"
        )
    try:
        cls = point.load()
        made = cls(
            log_dir=config.log_dir,
            redirects=in_std_of(cls, config.redirects),
            tee=in_std_of(cls, config.tee),
            local_ranks_filter=config.local_ranks_filter,
        )
    except Exception as exc:  # the site's code: any failure is its message
        raise ConfigError(
            f"--logs-specs: {config.logs_specs!r} ({point.value}) could not be made: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    log.info("Worker logs: --logs-specs %s (%s)", config.logs_specs, point.value)
    return made


def in_std_of(cls: type, value: Any) -> Any:
    """An output option (a ``Std``, or one per local rank) in the ``Std`` of the module
    that defines ``cls``' ``LogsSpecs`` base: torch's ``to_map`` knows its own ``Std``
    only (agentd's has the same values)."""
    from agentd.workers.logs_specs import std_as

    base = next((c for c in cls.__mro__ if c.__name__ == "LogsSpecs"), None)
    std = getattr(sys.modules.get(base.__module__), "Std", None) if base else None
    return value if std is None else std_as(value, std)


def _heartbeats(config: AgentConfig) -> HeartbeatSettings | None:
    """Hang detection's settings where an option changed them (None: the defaults, built
    with the heartbeat service at the workers' first heartbeat)."""
    given = {field: getattr(config, option) for option, field in _HEARTBEAT_OPTIONS.items()}
    if given == {f: getattr(AgentConfig, o) for o, f in _HEARTBEAT_OPTIONS.items()}:
        return None
    from agentd.heartbeats.settings import HeartbeatSettings

    return HeartbeatSettings(**given)


_HEARTBEAT_OPTIONS = {
    "initial_heartbeat_timeout": "initial_timeout",
    "heartbeat_timeout": "step_timeout",
    "resume_heartbeat_timeout": "resume_timeout",
    "section_timeout": "section_timeouts",
    "heartbeat_safety_factor": "safety_factor",
    "heartbeat_min_timeout": "min_timeout",
    "straggler_factor": "straggler_factor",
    "straggler_steps": "straggler_steps",
}
"""The options of hang detection: each one's field of :class:`HeartbeatSettings`."""


def _drain(config: AgentConfig) -> DrainSettings | None:
    """The drain's settings where an option changed them (None: the defaults, built with
    the drain's service if the node ever drains)."""
    given = (config.drain_on, config.drain_timeout, config.checkpoint_signal)
    if given == (AgentConfig.drain_on, AgentConfig.drain_timeout, AgentConfig.checkpoint_signal):
        return None
    from agentd.drain.settings import DrainSettings

    return DrainSettings(*given)


def _inprocess(config: AgentConfig) -> InProcessSettings | None:
    """In-process restarts' settings where an option changed them (None: the defaults,
    loaded with the in-process service where the group can restart at all)."""
    given = (config.inprocess_park_timeout, config.inprocess_quick_restarts)
    if given == (AgentConfig.inprocess_park_timeout, AgentConfig.inprocess_quick_restarts):
        return None
    from agentd.inprocess.settings import InProcessSettings

    return InProcessSettings(*given)


def _slow_nodes(config: AgentConfig, spec: WorkerSpec) -> SlowNodeSettings | None:
    """The straggler comparison's settings, where the rendezvous compares nodes at all."""
    from agentd.rendezvous.api import ComparesNodes

    if not isinstance(spec.rdzv_handler, ComparesNodes):
        return None
    from agentd.slownodes.settings import SlowNodeSettings

    return SlowNodeSettings(
        config.straggler_interval, config.straggler_factor, config.replace_stragglers
    )


def _health(config: AgentConfig) -> HealthSettings | None:
    """The health endpoint's settings, if ``--health-port`` asked for one."""
    if config.health_port is None:
        return None
    from agentd.health.settings import HealthSettings

    token = config.drain_token
    if token is not None and token == config.store_token:
        raise ConfigError(
            "--drain-token: must differ from the store token (each listener has its own "
            "secret: the health port never carries the store's)"
        )
    cert, key = config.health_cert, config.health_key
    if (cert is None) != (key is None):
        given, missing = (
            ("--health-cert", "--health-key") if key is None else ("--health-key", "--health-cert")
        )
        raise ConfigError(f"{given}: needs {missing} (the endpoint serves TLS with both)")
    return HealthSettings(
        config.health_port, config.health_host, config.health_timeout, token, cert=cert, key=key
    )


def _node_gate(config: AgentConfig, spec: WorkerSpec) -> NodeGate:
    import tempfile
    from pathlib import Path

    from agentd.nodecheck.checks import build_checks
    from agentd.nodecheck.gate import NodeCheckSettings, NodeGate
    from agentd.store.candidates import parse_candidates

    store = None
    if config.rdzv_endpoint and not config.standalone and config.rdzv_backend != "static":
        store = parse_candidates(config.rdzv_endpoint)[0]  # static's: the workers' (not up yet)
    log_dir = Path(config.log_dir) if config.log_dir else Path(tempfile.gettempdir())
    checks = build_checks(config.node_check, log_dir, spec.local_world_size, store)
    settings = NodeCheckSettings(
        config.node_check_interval, config.node_check_cooldown, config.node_check_max_exclusions
    )
    return NodeGate(checks, settings)
