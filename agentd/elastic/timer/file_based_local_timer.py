"""``torch.distributed.elastic.timer.file_based_local_timer``."""

from agentd.timer.file_pipe import FileTimerClient, FileTimerRequest
from agentd.timer.file_server import FileTimerServer

__all__ = ["FileTimerClient", "FileTimerRequest", "FileTimerServer"]
