"""Any agent's reading of the job view (:mod:`agentd.jobview.document`): the header from
the agent itself, the rows from its round's records in the store, in one request.

A rendezvous without a store (a standalone job, a static one) has no records: its view
is this node's own row, read live.

Once the agent's run is over (its shutdown began: the store may be gone with it), the
view is the last one read from the store with this node's own row read live, and its
header says how the run ended (``ended``: the group's final state; None before): a
watcher (``agentd status --job --watch``) draws that and stops, where it used to lose the
agent between two requests and end in "cannot reach" though the job had ended well.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentd.jobview.document import job_document
from agentd.jobview.record import StepRate, node_record
from agentd.rendezvous.api import ShowsJob

if TYPE_CHECKING:
    from agentd.view import AgentView


class JobReading:
    """Reads ``view``'s job view, keeping the last records read for after the run."""

    def __init__(self, view: AgentView) -> None:
        self._view = view
        self._last: tuple[int, dict[int, dict[str, Any]], int] = (-1, {}, 0)

    async def read(self) -> dict[str, Any]:
        """The view now (a store error propagates, before the run's end only)."""
        view = self._view
        group = view.get_worker_group()
        handler = view.rdzv_handler
        size = group.group_world_size or 1
        own = group.group_rank if group.group_rank is not None else 0
        over = view.run_over
        header: dict[str, Any] = {
            "run_id": view.run_id,
            "generation": view.generation,
            "world_size": group.workers[0].world_size if group.workers else None,
            "size": size,
            "answered_by": own,
            "ended": group.state.value if over else None,
        }
        if isinstance(handler, ShowsJob):
            settings = handler.settings
            generation, records, spares = self._last
            if not over:
                records, spares = await handler.job.gather(view.generation, size)
                self._last = (view.generation, records, spares)
            elif generation != view.generation:
                records, spares = {}, 0
            records = dict(records)
            node, host = handler.job.node_id, handler.job.addr
            header.update(
                min_nodes=settings.min_nodes,
                max_nodes=settings.max_nodes,
                spares=spares,
                store=handler.store_status(),
            )
        else:
            records, node, host = {}, view.hostname, view.hostname
            header.update(min_nodes=size, max_nodes=size, spares=0, store=None)
        checks = view.node_check_status() or {}
        header["excluded"] = {
            node: str(doc.get("reason", ""))
            for node, doc in checks.get("excluded_peers", {}).items()
        }  # the peers the last round lost that keep themselves out (their node checks fail)
        if over or own not in records:  # none written this round yet, or the run ended:
            # its row read live, and what it no longer knows (the steps of workers gone)
            # from its last record
            live = node_record(view, node, host, StepRate())
            known = {k: v for k, v in live.items() if v is not None}
            records[own] = {**records.get(own, {}), **known}
        return job_document(header, records, size, time.time())
