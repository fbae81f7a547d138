"""Error files (torch's ``@record`` format), agentd's own ``record``, and failure reports."""

from __future__ import annotations

import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentd.spec import RunResult, WorkerFailure, WorkerState

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ErrorFileContent:
    """What a worker wrote into its error file: ``message`` and ``traceback`` (may be empty)."""

    message: str
    traceback: str
    timestamp: float | None
    data: dict[str, Any]
    """The whole document, as torch's ``ProcessFailure.error_file_data``."""


def error_file_payload(exc: BaseException) -> dict[str, Any]:
    """The torch ``@record`` error-file document for ``exc`` (call while handling it)."""
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(
                    traceback.format_exception(type(exc), exc, exc.__traceback__)
                ),
                "timestamp": str(int(time.time())),
            },
        }
    }


def write_error_file(exc: BaseException, path: str | None = None) -> None:
    """Write ``exc`` to ``path`` or ``$TORCHELASTIC_ERROR_FILE``; silently nothing without one."""
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fp:
        json.dump(error_file_payload(exc), fp)
    os.replace(tmp, path)


class ChildFailedError(Exception):
    """A worker group failed: ``failures`` by global rank, the first one the root cause.

    torch's exception of that name (``elastic_launch`` raises it). A ``@record``-decorated
    launcher that lets it escape copies the root cause's error file into its own error
    file, so a scheduler above sees the worker's error, not the launcher's.
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

    def format_msg(self) -> str:
        result = RunResult(WorkerState.FAILED, failures=self.failures)
        return "\n" + format_failure_report(result, "", self.name)


def record(fn: _F) -> _F:
    """Decorate a worker's main function: an uncaught exception lands in the error file.

    The same contract as torch's ``torch.distributed.elastic.multiprocessing.errors.record``,
    without needing torch. The exception is re-raised, so the worker still exits non-zero.
    For a :class:`ChildFailedError` (a launcher's), the root cause's error file is copied.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                write_error_file(exc)
            raise
        except ChildFailedError as exc:
            _, root = exc.get_first_failure()
            if not copy_error_file(root.error_file):
                write_error_file(exc)
            raise
        except BaseException as exc:
            write_error_file(exc)
            raise

    return wrapper  # type: ignore[return-value]


def copy_error_file(source: str, path: str | None = None) -> bool:
    """Copy a worker's error file to ``path`` or ``$TORCHELASTIC_ERROR_FILE`` (a launcher's
    own); False when there is nothing to copy or nowhere to put it."""
    path = path or os.environ.get(ERROR_FILE_ENV)
    content = read_error_file(source) if source else None
    if not path or content is None or os.path.abspath(source) == os.path.abspath(path):
        return False
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fp:
        json.dump(content.data, fp)
    os.replace(tmp, path)
    return True


def read_error_file(path: str) -> ErrorFileContent | None:
    """Read a worker's error file; None when it is missing, empty or not in a known shape.

    Accepts torch's documented shape (``message`` a dict with ``message`` and
    ``extraInfo.py_callstack``) and a plain string ``message``. Never raises.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            data = json.load(fp)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "message" not in data:
        return None
    body = data["message"]
    if isinstance(body, str):
        return ErrorFileContent(body, "", None, data)
    if not isinstance(body, dict):
        return None
    extra = body.get("extraInfo")
    if not isinstance(extra, dict):
        extra = {}
    stamp: float | None
    try:
        stamp = float(extra.get("timestamp"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        stamp = None
    return ErrorFileContent(
        message=str(body.get("message", "")),
        traceback=str(extra.get("py_callstack", "")),
        timestamp=stamp,
        data=data,
    )


def format_failure_report(result: RunResult, run_id: str, entrypoint: str) -> str:
    """The human-readable failure report: the root cause in full, other failures in one line."""
    root = result.root_cause
    if root is None:
        return f"{entrypoint} failed (run {run_id}) with no recorded worker failure"
    bar = "=" * 72
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.timestamp))
    lines = [
        bar,
        f"{entrypoint} FAILED" + (f" (run {run_id})" if run_id else ""),
        bar,
        "Root cause (first failure):",
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


def _describe_exit(failure: WorkerFailure) -> str:
    if failure.signal_name():
        return f"{failure.exitcode} ({failure.signal_name()})"
    return str(failure.exitcode)
