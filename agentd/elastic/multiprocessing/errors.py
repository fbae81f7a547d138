"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.reports.error_files import ChildFailedError, record
from agentd.spec import WorkerFailure as ProcessFailure

__all__ = ["ChildFailedError", "ProcessFailure", "record"]
