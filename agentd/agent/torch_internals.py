"""torch's own methods of its agent template, which its tests and some frameworks call.

A mixin of :class:`~agentd.agent.template.SimpleElasticAgent`: ``_record_metrics`` and
``_record_flakiness_metric`` publish torch's ``workers.<role>.*`` metrics at the end of a
run (group ``torchelastic``), ``_record_restart`` the restarts left at each restart,
``_record_worker_events`` one status event per worker, ``_construct_event`` builds torch's
event for the agent or a worker (``record_duration`` records one that times a block), and
``get_event_succeeded`` / ``get_event_failed`` are the agent's own outcome as torch's
launcher records it. ``_assign_worker_ranks`` is torch's rank assignment over a store its
peers share. The metrics go through the ``put_metric`` of :mod:`agentd.agent.template`
(torch's agent module, which a test or a framework patches), through the template's
``_put_metric``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentd.group import RunResult, Worker, WorkerGroup, WorkerState
from agentd.rendezvous.api import RoleInstanceInfo

if TYPE_CHECKING:
    from agentd.rendezvous.api import RendezvousHandler
    from agentd.spec import WorkerSpec
    from agentd.telemetry.events import Event, EventSource

ROLE_INFO_KEY = "torchelastic/role_info/{}"


def _worker_events_heard(destination: str) -> bool:
    """Whether a worker's status event sent to ``destination`` reaches anyone: a handler
    configured (which loads the events module), the ``console`` destination, the default
    handler's DEBUG records, or a handler a site put on torch's logger of that
    destination. When none would, the events are not built (nor their module loaded)."""
    if "agentd.telemetry.events" in sys.modules or destination == "console":
        return True
    if logging.getLogger("agentd.telemetry.events").isEnabledFor(logging.DEBUG):
        return True
    return bool(logging.getLogger(f"torchelastic-events-{destination}").handlers)


class TorchInternals:
    """torch's metrics, events and rank assignment of a run (see the module)."""

    _worker_group: WorkerGroup
    _remaining_restarts: int
    _total_execution_time: int

    @property
    def rdzv_handler(self) -> RendezvousHandler:
        raise NotImplementedError

    def _put_metric(self, name: str, value: float) -> None:
        """Publish one metric (the template's goes through its module's ``put_metric``)."""
        raise NotImplementedError

    def _record_metrics(self, group_results: RunResult) -> None:
        """The end-of-run metrics: ``run_total`` and which of success/failure with/without
        retries happened (1, the others 0), and ``flakiness``."""
        failed = group_results.is_failed()
        self._record_flakiness_metric(failed)
        role = self._worker_group.spec.role
        retried = self._remaining_restarts != self._worker_group.spec.max_restarts
        self._put_metric(f"workers.{role}.run_total", 1)
        for name, happened in (
            ("run_success_with_retries", not failed and retried),
            ("run_success_no_retries", not failed and not retried),
            ("run_failed_with_retries", failed and retried),
            ("run_failed_no_retries", failed and not retried),
        ):
            self._put_metric(f"workers.{role}.{name}", 1 if happened else 0)

    def _record_restart(self) -> None:
        """At each restart: the restarts left, ``workers.<role>.remaining_restarts``."""
        role = self._worker_group.spec.role
        self._put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)

    def _record_flakiness_metric(self, is_failed: bool = False) -> None:
        """100 for a failed run, else the share of restarts spent (0 without any)."""
        spec = self._worker_group.spec
        flakiness = (
            100.0
            if is_failed
            else (100.0 - 100.0 * (self._remaining_restarts + 1) / (spec.max_restarts + 1))
        )
        self._put_metric(f"workers.{spec.role}.flakiness", int(flakiness))

    def _record_worker_events(self, result: RunResult) -> None:
        """One ``torchelastic.worker.status.<STATE>`` event per worker, as torch's: the
        group's state for a worker that failed or returned, ``TERMINATED`` for one stopped
        because others failed."""
        group = self._worker_group
        if not _worker_events_heard(group.spec.event_log_handler):
            return
        from agentd.telemetry import events  # at the end of a run, off the launch path

        failed = result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        for worker in group.workers:
            failure = result.failures.get(worker.global_rank)
            state = "TERMINATED" if failed and failure is None else result.state.value
            if failure is None:
                event = self._construct_event(state, "WORKER", worker)
            else:
                event = self._construct_event(
                    state,
                    "WORKER",
                    worker,
                    json.dumps(failure.error_file_data),
                    exit_code=failure.exitcode,
                    worker_pid=failure.pid,
                )
            events.record(event, group.spec.event_log_handler)

    @contextlib.contextmanager
    def record_duration(self, state: str) -> Iterator[None]:
        """Time the block, then record torch's agent event ``state`` with its
        ``duration_ms`` (torch's template times its rendezvous and rank assignment so; a
        subclass may time its own steps)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            from agentd.telemetry import events

            elapsed_ms = (time.perf_counter() - started) * 1000
            event = self._construct_event(state, "AGENT", duration_ms=elapsed_ms)
            events.record(event, self._worker_group.spec.event_log_handler)

    def _construct_event(
        self,
        state: str,
        source: EventSource | str,
        worker: Worker | None = None,
        raw_error: str | None = None,
        duration_ms: float | None = None,
        exit_code: int | None = None,
        worker_pid: int | None = None,
    ) -> Event:
        """torch's status event for the agent, or for ``worker`` when given."""
        group = self._worker_group
        spec = group.spec
        details: dict[str, Any] = {
            "group_world_size": group.group_world_size,
            "entry_point": spec.get_entrypoint_name(),
        }
        if worker is not None:
            details |= {
                "local_rank": (worker.local_rank,),
                "role_rank": (worker.role_rank,),
                "role_world_size": (worker.role_world_size,),
            }
        if exit_code is not None or worker_pid is not None:
            details |= {"exit_code": (exit_code,), "worker_pid": (worker_pid,)}
        metadata = {
            "run_id": self.rdzv_handler.get_run_id(),
            "global_rank": worker.global_rank if worker is not None else None,
            "group_rank": group.group_rank,
            "worker_id": str(worker.id) if worker is not None else None,
            "role": spec.role,
            "hostname": fq_hostname(),
            "state": str(state),
            "total_run_time": self._total_execution_time,
            "rdzv_backend": self.rdzv_handler.get_backend(),
            "raw_error": raw_error,
            "metadata": json.dumps(details),
            "agent_restarts": spec.max_restarts - self._remaining_restarts,
            "duration_ms": duration_ms,
        }
        from agentd.telemetry.events import Event, EventSource

        return Event(f"torchelastic.worker.status.{state}", EventSource(source), metadata=metadata)

    def get_event_succeeded(self) -> Event:
        """The agent's run ended (whatever its workers did): what torch's launcher records."""
        return self._construct_event("SUCCEEDED", "AGENT")

    def get_event_failed(self) -> Event:
        """The agent's run raised: what torch's launcher records."""
        return self._construct_event("FAILED", "AGENT", raw_error=_current_error())

    def _assign_worker_ranks(
        self, store: Any, group_rank: int, group_world_size: int, spec: WorkerSpec
    ) -> list[Worker]:
        """Ranks for this agent's workers from every agent's role info, exchanged through
        ``store`` (torch's store API: ``set`` and a blocking ``get``)."""
        from agentd.agent.rendezvous_steps import assign_worker_ranks

        mine = RoleInstanceInfo(spec.role, group_rank, spec.local_world_size)
        store.set(ROLE_INFO_KEY.format(group_rank), mine.serialize())
        infos = [
            RoleInstanceInfo.deserialize(store.get(ROLE_INFO_KEY.format(rank)))
            for rank in range(group_world_size)
        ]
        return assign_worker_ranks(infos, group_rank, spec)


def fq_hostname() -> str:
    """This host's fully qualified name (torch's ``_get_fq_hostname``)."""
    return socket.getfqdn(socket.gethostname())


def _current_error() -> str | None:
    import sys
    import traceback

    if sys.exc_info()[0] is None:
        return None
    return traceback.format_exc()
