"""``torch.distributed.elastic.multiprocessing``."""

from agentd.elastic.multiprocessing.api import (
    DefaultLogsSpecs,
    LogsDest,
    LogsSpecs,
    MultiprocessContext,
    PContext,
    ProcessFailure,
    RunProcsResult,
    SignalException,
    Std,
    SubprocessContext,
    start_processes,
    to_map,
)

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "MultiprocessContext",
    "PContext",
    "ProcessFailure",
    "RunProcsResult",
    "SignalException",
    "Std",
    "SubprocessContext",
    "start_processes",
    "to_map",
]
