"""torch's launcher API (``torch.distributed.launcher.api``): launch an agent from Python.

``elastic_launch(LaunchConfig(...), entrypoint)(*args)`` builds the rendezvous handler,
the worker spec and a :class:`~agentd.agent.local.LocalElasticAgent` from the config, runs
it to completion, and returns the workers' return values by global rank (empty for a
command). A failed group raises :class:`~agentd.errors.record.ChildFailedError`
naming the root cause; decorated with ``@record``, the launching process copies the root
cause's error file into its own ``TORCHELASTIC_ERROR_FILE``, as torch's does.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentd.agent.local import LocalElasticAgent
from agentd.elastic import events
from agentd.errors.record import ChildFailedError
from agentd.exceptions import AgentStopped, field_error
from agentd.rendezvous import registry
from agentd.spec import WorkerSpec
from agentd.workers.env import SIGNALS_ENV
from agentd.workers.logs_specs import DefaultLogsSpecs, LogsSpecs

log = logging.getLogger(__name__)

DEFAULT_RDZV_TIMEOUT = 900


@dataclass
class LaunchConfig:
    """torch's launch configuration, field for field. ``numa_options`` is refused when set
    (agentd does not bind workers to NUMA nodes); ``metrics_cfg`` is accepted for
    compatibility (metrics go through :mod:`agentd.telemetry.metrics_api`)."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: LogsSpecs | None = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    numa_options: Any = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    shutdown_timeout: int | None = None

    def __post_init__(self) -> None:
        if self.rdzv_timeout != -1:
            self.rdzv_configs["timeout"] = self.rdzv_timeout
        elif "timeout" not in self.rdzv_configs:
            self.rdzv_configs["timeout"] = DEFAULT_RDZV_TIMEOUT
        if self.logs_specs is None:
            self.logs_specs = DefaultLogsSpecs()
        if self.numa_options is not None:
            raise field_error(
                "numa_options",
                self.numa_options,
                "must be left unset (agentd does not bind NUMA nodes)",
            )


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)``: run ``entrypoint`` (a function or a
    command) under an agent built from ``config``; see the module docstring."""

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str | None) -> None:
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args))


def launch_agent(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str | None, args: list[Any]
) -> dict[int, Any]:
    """Run one agent for ``config`` to completion (see the module docstring).

    As torch's: the agent's outcome is recorded as an event (``get_event_succeeded`` when
    ``run()`` returned, ``get_event_failed`` when it raised), and the rendezvous is left
    afterwards unless the agent was stopped by a signal (a restarted agent rejoins it).
    ``LocalElasticAgent``, ``events`` and ``registry`` are looked up in this module at each
    call, so a test that patches them here is obeyed."""
    if entrypoint is None:
        raise field_error("entrypoint", None, "is required (a function or a command)")
    if not config.run_id:
        config.run_id = os.urandom(8).hex()
        log.warning("config has no run_id; using a random one: %s", config.run_id)
    params = registry.RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    handler = registry.get_rendezvous_handler(params)
    os.environ[SIGNALS_ENV] = config.signals_to_handle
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        rdzv_handler=handler,
        entrypoint=entrypoint,
        args=tuple(args),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        virtual_local_rank=config.virtual_local_rank,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
    )
    if config.shutdown_timeout is not None:
        spec.stop_timeout = float(config.shutdown_timeout)
    agent = LocalElasticAgent(
        spec,
        config.logs_specs,
        config.start_method,
        log_line_prefix_template=config.log_line_prefix_template,
    )
    leave_rendezvous = True
    try:
        result = agent.run()
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        if result.is_failed():
            raise ChildFailedError(name=spec.get_entrypoint_name(), failures=result.failures)
        return result.return_values
    except ChildFailedError:
        raise
    except AgentStopped:
        leave_rendezvous = False  # leaving would close the round to a restarted agent
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except Exception:
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    finally:
        if leave_rendezvous:
            handler.shutdown()  # torch's face: synchronous


def _get_entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: list[Any]) -> str:
    """What torch's launcher calls the job: a function's name; for the Python interpreter,
    its first argument that is not an option (``python -u train.py`` -> ``train.py``); any
    other command itself; else ""."""
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", ""))
    if entrypoint == sys.executable:
        return next((str(arg) for arg in args if not str(arg).startswith("-")), "")
    return entrypoint or ""
