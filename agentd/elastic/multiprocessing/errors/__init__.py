"""``torch.distributed.elastic.multiprocessing.errors``."""

from agentd.reports.error_handler import ErrorHandler, get_error_handler
from agentd.reports.failure import ChildFailedError, record
from agentd.reports.process_failure import ProcessFailure

__all__ = ["ChildFailedError", "ErrorHandler", "ProcessFailure", "get_error_handler", "record"]
