"""``torch.distributed.elastic.events.api``: the event types."""

from agentd.reports.events import Event, EventSource
from agentd.reports.rdzv_events import NodeState, RdzvEvent

__all__ = ["Event", "EventSource", "NodeState", "RdzvEvent"]
