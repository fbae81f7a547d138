"""A closed rendezvous's error, read from its ``ctl/closed`` document: what closed it,
and, for the run id torchrun uses by default, why a new job may find it closed."""

from __future__ import annotations

import json

from agentd.rendezvous.api import RendezvousClosedError
from agentd.rendezvous.keys import SHARED_RUN_ID

SHARED_RUN_HINT = (
    " (the run id is torchrun's default: if another job runs at this endpoint, give each "
    "its own --rdzv-id or port)"
)


def closed_error(run_id: str, raw: bytes, *, newcomer: bool = False) -> RendezvousClosedError:
    """The error a closed rendezvous raises, from its ``ctl/closed`` document; to an agent
    that never saw a round of it (``newcomer``) under the default id, why it is closed."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = {}
    succeeded = doc.get("outcome") == "succeeded"
    what = "the job succeeded" if succeeded else f"node {doc.get('node', '?')} failed"
    reason = doc.get("reason", "")
    hint = ""
    if newcomer and run_id == SHARED_RUN_ID:
        hint = (
            f"; {run_id!r} is torchrun's default run id: if this is a new job, a store that "
            "outlives its jobs (agentd store, etcd) needs each job to have an --rdzv-id of "
            "its own"
        )
    return RendezvousClosedError(
        f"rendezvous {run_id!r} is closed: {what}" + (f" ({reason})" if reason else "") + hint,
        succeeded=succeeded,
    )
