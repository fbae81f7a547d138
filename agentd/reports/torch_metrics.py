"""The metrics and events torch's agent publishes, published the same way here.

At the end of a run: ``workers.<role>.run_total``, ``run_success_with_retries``,
``run_success_no_retries``, ``run_failed_with_retries``, ``run_failed_no_retries`` (1 for
what happened, 0 for the others) and ``flakiness``; at every restart
``workers.<role>.remaining_restarts``; all in the ``torchelastic`` group through
:func:`agentd.reports.metrics_api.put_metric`. And one ``torchelastic.worker.status.<STATE>``
event per worker (source WORKER) with torch's metadata, through
:func:`agentd.reports.events.record`. So a site's ``MetricHandler`` or event handler sees under
agentd what it sees under torch.
"""

from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Protocol

from agentd.group import RunResult, WorkerGroup, WorkerState
from agentd.reports.metrics_api import put_metric

if TYPE_CHECKING:
    from agentd.rendezvous.api import RendezvousHandler


class RunView(Protocol):
    """What the records need of an agent: any
    :class:`~agentd.agent.template.SimpleElasticAgent` offers it."""

    @property
    def rdzv_handler(self) -> RendezvousHandler: ...

    @property
    def remaining_restarts(self) -> int: ...

    def get_worker_group(self) -> WorkerGroup: ...


def publish_restart(agent: RunView) -> None:
    role = agent.get_worker_group().spec.role
    put_metric(f"workers.{role}.remaining_restarts", agent.remaining_restarts)


def publish_run(agent: RunView, result: RunResult, started: float) -> None:
    """The end-of-run metrics and the workers' status events (see the module doc)."""
    spec = agent.get_worker_group().spec
    failed = result.is_failed()
    retried = agent.remaining_restarts != spec.max_restarts
    metrics = {
        "run_success_with_retries": not failed and retried,
        "run_success_no_retries": not failed and not retried,
        "run_failed_with_retries": failed and retried,
        "run_failed_no_retries": failed and not retried,
    }
    put_metric(f"workers.{spec.role}.run_total", 1)
    for name, happened in metrics.items():
        put_metric(f"workers.{spec.role}.{name}", 1 if happened else 0)
    flakiness = 100.0 if failed else (
        100.0 - 100.0 * (agent.remaining_restarts + 1) / (spec.max_restarts + 1))  # fmt: skip
    put_metric(f"workers.{spec.role}.flakiness", int(flakiness))
    _record_worker_events(agent, result, time.monotonic() - started)


def _record_worker_events(agent: RunView, result: RunResult, took: float) -> None:
    from agentd.reports.events import Event, EventSource, record

    group = agent.get_worker_group()
    spec = group.spec
    hostname = socket.getfqdn()
    for worker in group.workers:
        failure = result.failures.get(worker.global_rank)
        state = (WorkerState.FAILED if failure is not None else
                 WorkerState.SUCCEEDED if worker.global_rank in result.return_values
                 or result.state is WorkerState.SUCCEEDED else result.state)  # fmt: skip
        details = {
            "group_world_size": group.group_world_size,
            "entry_point": spec.get_entrypoint_name(),
            "local_rank": (worker.local_rank,),
            "role_rank": (worker.role_rank,),
            "role_world_size": (worker.role_world_size,),
            "exit_code": (failure.exitcode if failure else None,),
            "worker_pid": (failure.pid if failure else worker.id,),
        }
        record(Event(
            f"torchelastic.worker.status.{state.value}",
            EventSource.WORKER,
            metadata={
                "run_id": agent.rdzv_handler.get_run_id(),
                "global_rank": worker.global_rank,
                "group_rank": group.group_rank,
                "worker_id": str(worker.id),
                "role": spec.role,
                "hostname": hostname,
                "state": state.value,
                "total_run_time": int(took),
                "rdzv_backend": agent.rdzv_handler.get_backend(),
                "raw_error": json.dumps(failure.error_file_data) if failure else None,
                "metadata": json.dumps(details),
                "agent_restarts": spec.max_restarts - agent.remaining_restarts,
                "duration_ms": None,
            },
        ), spec.event_log_handler)  # fmt: skip
