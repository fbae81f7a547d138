"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.errors import record
from agentd.spec import WorkerFailure as ProcessFailure

__all__ = ["ProcessFailure", "record"]
