"""agentd's own ``@record`` (torch's contract, without torch), and the error a launcher
raises when its workers failed (torch's ``ChildFailedError``, with torch's text)."""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from agentd.errors.error_handler import ErrorHandler, get_error_handler

if TYPE_CHECKING:
    from agentd.group import WorkerFailure

_F = TypeVar("_F", bound=Callable[..., Any])
log = logging.getLogger(__name__)


class ChildFailedError(Exception):
    """A worker group failed: ``failures`` by global rank, the first one the root cause.

    torch's exception of that name (``elastic_launch`` raises it), with torch's text: the
    other failures, then the root cause, each as ``time``, ``host``, ``rank``, ``exitcode``,
    ``error_file`` and ``traceback`` lines. A ``@record``-decorated launcher that lets it
    escape copies the root cause's error file into its own error file, so a scheduler above
    sees the worker's error, not the launcher's.
    """

    def __init__(self, name: str, failures: dict[int, WorkerFailure]) -> None:
        if not failures:
            raise ValueError("failures: must name at least one failed worker")
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple[int, WorkerFailure]:
        """(global rank, failure) of the root cause: the earliest failure."""
        rank = min(self.failures, key=lambda r: (self.failures[r].timestamp, r))
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        root_rank, _ = self.get_first_failure()
        blocks = {
            rank: _failure_block(i, rank, f) for i, (rank, f) in enumerate(self.failures.items())
        }
        title = f"{self.name} FAILED"
        width = min(
            60, max(len(line) for text in [title, *blocks.values()] for line in text.splitlines())
        )
        others = [text for rank, text in blocks.items() if rank != root_rank]
        return "\n".join(
            [
                "",
                boarder_delim * width,
                title,
                section_delim * width,
                "Failures:",
                "\n".join(others) or "  <NO_OTHER_FAILURES>",
                section_delim * width,
                "Root Cause (first observed failure):",
                blocks[root_rank],
                boarder_delim * width,
            ]
        )


def _failure_block(index: int, rank: int, failure: WorkerFailure) -> str:
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(failure.timestamp))
    text = failure.traceback or failure.message or failure.stderr_tail or "<N/A>"
    return "\n".join(
        [
            f"[{index}]:",
            f"  time      : {when}",
            f"  host      : {failure.host or socket.getfqdn()}",
            f"  rank      : {rank} (local_rank: {failure.local_rank})",
            f"  exitcode  : {failure.exitcode} (pid: {failure.pid})",
            f"  error_file: {failure.error_file or '<N/A>'}",
            "  traceback : " + text.rstrip().replace("\n", "\n  "),
        ]
    )


def record(fn: _F, error_handler: ErrorHandler | None = None) -> _F:
    """Decorate a worker's main function: an uncaught exception lands in the error file.

    The same contract as torch's ``torch.distributed.elastic.multiprocessing.errors.record``,
    without needing torch: the exception is re-raised, so the worker still exits non-zero;
    ``SystemExit(0)`` is a clean exit and returns None; for a :class:`ChildFailedError` (a
    launcher's) the root cause's error file is copied, and nothing is written when the
    root cause left none. ``faulthandler`` is enabled, so a native crash leaves a stack.
    ``error_handler`` (torch's argument) does the writing; by default
    :func:`~agentd.errors.error_handler.get_error_handler`'s.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handler = error_handler or get_error_handler()
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code == 0:
                return None
            if exc.code is not None:
                handler.record_exception(exc)
            raise
        except ChildFailedError as exc:
            _, root = exc.get_first_failure()
            if root.error_file and root.error_file != "<N/A>":
                handler.dump_error_file(root.error_file, root.exitcode)
            else:
                log.info("The root cause (pid %d) left no error file to copy", root.pid)
            raise
        except BaseException as exc:
            handler.record_exception(exc)
            raise

    return wrapper  # type: ignore[return-value]
