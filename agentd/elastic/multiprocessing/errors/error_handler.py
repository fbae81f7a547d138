"""``torch.distributed.elastic.multiprocessing.errors.error_handler``."""

from agentd.errors.error_handler import ErrorHandler, get_error_handler

__all__ = ["ErrorHandler", "get_error_handler"]
