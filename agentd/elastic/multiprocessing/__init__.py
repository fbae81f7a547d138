"""``torch.distributed.elastic.multiprocessing``."""

from agentd.elastic.multiprocessing.api import (
    DefaultLogsSpecs,
    LogsDest,
    LogsSpecs,
    ProcessFailure,
    RunProcsResult,
    SignalException,
    Std,
    to_map,
)

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "ProcessFailure",
    "RunProcsResult",
    "SignalException",
    "Std",
    "to_map",
]
