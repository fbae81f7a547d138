"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.group import WorkerFailure as ProcessFailure
from agentd.reports.failure import ChildFailedError, record

__all__ = ["ChildFailedError", "ProcessFailure", "record"]
