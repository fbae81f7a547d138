"""``torch.distributed.elastic.timer``: expiration timers."""

from agentd.timer import (
    FileTimerClient,
    FileTimerServer,
    LocalTimerClient,
    LocalTimerServer,
    TimerClient,
    TimerRequest,
    TimerServer,
    configure,
    expires,
)

__all__ = [
    "FileTimerClient",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
    "configure",
    "expires",
]
