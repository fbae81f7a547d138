"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.errors import ChildFailedError, record
from agentd.spec import WorkerFailure as ProcessFailure

__all__ = ["ChildFailedError", "ProcessFailure", "record"]
