"""``torch.distributed.elastic.events.api``: the event types."""

from agentd.telemetry.events import Event, EventSource
from agentd.telemetry.rdzv_events import NodeState, RdzvEvent

__all__ = ["Event", "EventSource", "NodeState", "RdzvEvent"]
