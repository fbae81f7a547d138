"""What a failure report says of a peer lost mid-round (its lease ran out)."""

from __future__ import annotations

import time
from typing import Any

from agentd.rendezvous.api import LOST_REASON


def lost_node(why: str, ttl: float) -> dict[str, Any]:
    """What a report says of a lost peer, from the round watch's ``node <addr> (<id>) left
    (no heartbeat)`` (or ``node <id> ...``): its node id, host (its address, else the
    hostname in its id) and agent pid (node ids are ``host_pid_random``), when its lease
    was seen to lapse, and so when it was last heard (a lease lasts ``ttl``)."""
    node = why.removeprefix("node ").removesuffix(f" {LOST_REASON}")
    addr, _, named = node.partition(" (")  # "ADDR (ID)", or a bare id
    node = named.removesuffix(")") if named else addr
    host, _, rest = node.rpartition("_")[0].rpartition("_")
    pid = int(rest) if rest.isdigit() else None
    lapsed = time.time()
    return {
        "node": node,
        "host": (addr if named else host) or node,
        "agent_pid": pid,
        "lapsed_at": lapsed,
        "last_heard_before": ttl,
        "reason": why,
    }
