"""``torch.distributed.elastic.timer.local_timer``."""

from agentd.timer.local import LocalTimerClient, LocalTimerServer, MultiprocessingRequestQueue

__all__ = ["LocalTimerClient", "LocalTimerServer", "MultiprocessingRequestQueue"]
