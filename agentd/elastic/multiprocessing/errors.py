"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.reports.failure import ChildFailedError, record
from agentd.spec import WorkerFailure as ProcessFailure

__all__ = ["ChildFailedError", "ProcessFailure", "record"]
