"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.errors.error_handler import ErrorHandler, get_error_handler
from agentd.errors.record import ChildFailedError, record
from agentd.workers.process_failure import ProcessFailure

__all__ = ["ChildFailedError", "ErrorHandler", "ProcessFailure", "get_error_handler", "record"]
