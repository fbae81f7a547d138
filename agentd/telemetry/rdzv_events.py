"""torch's rendezvous events: what one node did in a rendezvous round, as a JSON record."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass


class NodeState(enum.StrEnum):
    """Where a node is in the rendezvous (torch's ``NodeState``)."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class RdzvEvent:
    """One rendezvous event (torch's ``RdzvEvent``); ``str()`` is its JSON."""

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    def serialize(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def deserialize(data: str | RdzvEvent) -> RdzvEvent:
        """The event :meth:`serialize` wrote (an event is returned as it is)."""
        if isinstance(data, RdzvEvent):
            return data
        doc = json.loads(data)
        doc["node_state"] = NodeState[doc["node_state"]]
        return RdzvEvent(**doc)
