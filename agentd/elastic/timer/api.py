"""``torch.distributed.elastic.timer.api``."""

from agentd.timer import configure, expires, get_client
from agentd.timer.api import RequestQueue, TimerClient, TimerRequest
from agentd.timer.server import TimerServer

__all__ = [
    "RequestQueue",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
    "get_client",
]
