"""``torch.distributed.elastic.events``."""

from agentd.reports.events import Event, EventSource, record

__all__ = ["Event", "EventSource", "record"]
