"""``torch.distributed.elastic.events``."""

from agentd.events import Event, EventSource, record

__all__ = ["Event", "EventSource", "record"]
