"""``torch.distributed.elastic.multiprocessing``: output settings."""

from agentd.spec import DefaultLogsSpecs, LogsSpecs, Std

__all__ = ["DefaultLogsSpecs", "LogsSpecs", "Std"]
