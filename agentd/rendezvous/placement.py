"""Whether the agents serve their workers' store (torch's ``use_agent_store``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.support.net import is_local_address

if TYPE_CHECKING:
    from agentd.group import WorkerGroup
    from agentd.rendezvous.api import RendezvousHandler


def agent_serves_store(handler: RendezvousHandler, group: WorkerGroup) -> bool:
    """The rendezvous wants an agent store, and a master address the user pinned (the
    spec's ``master_addr``) names this host. A pinned address elsewhere is the user's
    own: rank 0's worker hosts the store there, as before agents served it."""
    if not handler.use_agent_store:
        return False
    pinned = group.spec.master_addr
    return not pinned or is_local_address(pinned)
