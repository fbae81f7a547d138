"""Any agent's reading of the job view (:mod:`agentd.jobview.document`): the header from
the agent itself, the rows from its round's records in the store, in one request.

A rendezvous without a store (a standalone job, a static one) has no records: its view
is this node's own row, read live.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentd.jobview.document import job_document
from agentd.jobview.record import StepRate, node_record
from agentd.rendezvous.api import ShowsJob

if TYPE_CHECKING:
    from agentd.view import AgentView


async def read_job(view: AgentView) -> dict[str, Any]:
    """``view``'s account of its round now (a store error propagates)."""
    group = view.get_worker_group()
    handler = view.rdzv_handler
    size = group.group_world_size or 1
    own = group.group_rank if group.group_rank is not None else 0
    header: dict[str, Any] = {
        "run_id": view.run_id,
        "generation": view.generation,
        "world_size": group.workers[0].world_size if group.workers else None,
        "size": size,
        "answered_by": own,
    }
    if isinstance(handler, ShowsJob):
        settings = handler.settings
        records, spares = await handler.job.gather(view.generation, size)
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
        node: str(doc.get("reason", "")) for node, doc in checks.get("excluded_peers", {}).items()
    }  # the peers the last round lost that keep themselves out (their node checks fail)
    if own not in records:  # it has not written one this round yet: read it live
        records[own] = node_record(view, node, host, StepRate())
    return job_document(header, records, size, time.time())
