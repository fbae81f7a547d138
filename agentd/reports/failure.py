"""agentd's own ``@record`` (torch's contract, without torch), the error a launcher raises
when its workers failed, and the failure report that names the root cause."""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentd.group import RunResult, WorkerFailure
from agentd.reports.error_handler import get_error_handler

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


def record(fn: _F) -> _F:
    """Decorate a worker's main function: an uncaught exception lands in the error file.

    The same contract as torch's ``torch.distributed.elastic.multiprocessing.errors.record``,
    without needing torch: the exception is re-raised, so the worker still exits non-zero;
    ``SystemExit(0)`` is a clean exit and returns None; for a :class:`ChildFailedError` (a
    launcher's) the root cause's error file is copied, and nothing is written when the
    root cause left none. ``faulthandler`` is enabled, so a native crash leaves a stack.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handler = get_error_handler()
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


def format_failure_report(
    result: RunResult, run_id: str, entrypoint: str, lost_peer: dict[str, Any] | None = None
) -> str:
    """The human-readable failure report: the root cause in full, other failures in one
    line. A lost peer (``lost_peer``) is the root cause, this node's first failure what
    followed."""
    root = result.root_cause
    if root is None:
        return f"{entrypoint} failed (run {run_id}) with no recorded worker failure"
    bar = "=" * 72
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.timestamp))
    lines = [
        bar,
        f"{entrypoint} FAILED" + (f" (run {run_id})" if run_id else ""),
        bar,
        *_lost_peer_lines(lost_peer),
        "What followed on this node (first failure):"
        if lost_peer
        else "Root cause (first failure):",
        f"  time      : {when}.{int(root.timestamp * 1000) % 1000:03d}",
        f"  host      : {root.host}",
        f"  node rank : {root.node_rank}",
        f"  rank      : {root.global_rank} (local rank {root.local_rank}, role {root.role})",
        f"  pid       : {root.pid}",
        f"  exit code : {_describe_exit(root)}",
    ]
    if root.error_file:
        lines.append(f"  error file: {root.error_file}")
    if root.message:
        lines += ["  message   : " + root.message]
    if root.traceback:
        lines += ["  traceback :", *("    " + ln for ln in root.traceback.rstrip().splitlines())]
    elif root.stderr_tail:
        lines += ["  stderr (last lines):"]
        lines += ["    " + ln for ln in root.stderr_tail.rstrip().splitlines()]
    elif not root.message:
        lines.append("  (no error file and nothing on stderr; decorate main with @record)")
    others = [f for f in result.failures.values() if f is not root]
    if others:
        lines.append("Other failures:")
        for failure in sorted(others, key=lambda f: f.timestamp):
            lines.append(
                f"  rank {failure.global_rank} (local {failure.local_rank}, pid {failure.pid}): "
                f"{_describe_exit(failure)}" + (f": {failure.message}" if failure.message else "")
            )
    lines.append(bar)
    return "\n".join(lines)


def _lost_peer_lines(lost: dict[str, Any] | None) -> list[str]:
    if lost is None:
        return []
    lapsed = lost["lapsed_at"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lapsed))
    pid = lost.get("agent_pid")
    return [
        "Root cause (a lost node):",
        f"  node      : {lost['node']}",
        f"  host      : {lost['host']}"
        + (f" (its agent, pid {pid}, stopped answering)" if pid else ""),
        f"  last heard: {lost['last_heard_before']:g}s or less before its lease lapsed, at {when}",
        "  its loss failed the collectives of this node's ranks:",
    ]


def _describe_exit(failure: WorkerFailure) -> str:
    if failure.oom is not None:
        return f"{failure.exitcode} ({failure.signal_name()}: out of memory)"
    if failure.signal_name():
        return f"{failure.exitcode} ({failure.signal_name()})"
    return str(failure.exitcode)
