"""The restart metric and worker status events torch's agent publishes, published the
same way here.

At every restart ``workers.<role>.remaining_restarts`` (group ``torchelastic``, through
:func:`agentd.reports.metrics_api.put_metric`); at the end of a run one
``torchelastic.worker.status.<STATE>`` event per worker (source WORKER) with torch's
metadata, through :func:`agentd.reports.events.record`. The end-of-run metrics are the
agent's ``_record_metrics`` (:mod:`agentd.agent.torch_records`). So a site's
``MetricHandler`` or event handler sees under agentd what it sees under torch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from agentd.group import RunResult, Worker, WorkerGroup, WorkerState
from agentd.reports.events import Event, EventSource
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

    def _construct_event(
        self,
        state: str,
        source: EventSource | str,
        worker: Worker | None = None,
        raw_error: str | None = None,
        duration_ms: float | None = None,
    ) -> Event: ...


def publish_restart(agent: RunView) -> None:
    role = agent.get_worker_group().spec.role
    put_metric(f"workers.{role}.remaining_restarts", agent.remaining_restarts)


def record_worker_events(agent: RunView, result: RunResult) -> None:
    """One status event per worker, as torch's: the group's state for a worker that failed
    or returned, ``TERMINATED`` for one stopped because others failed."""
    from agentd.reports.events import record

    group = agent.get_worker_group()
    for worker in group.workers:
        failure = result.failures.get(worker.global_rank)
        failed = result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        state = "TERMINATED" if failed and failure is None else result.state.value
        raw_error = json.dumps(failure.error_file_data) if failure is not None else None
        event = agent._construct_event(state, EventSource.WORKER, worker, raw_error)
        if failure is not None:
            details = json.loads(event.metadata["metadata"])
            details |= {"exit_code": (failure.exitcode,), "worker_pid": (failure.pid,)}
            event.metadata["metadata"] = json.dumps(details)
        record(event, group.spec.event_log_handler)
