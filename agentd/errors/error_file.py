"""A worker's error file, in torch's ``@record`` format: written by the worker on an
uncaught exception, read by the agent for the failure report, copied by a launcher.

``{"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": "<traceback>",
"timestamp": "<epoch seconds>"}}}``. Reading never raises: a missing, empty or corrupt file
is None.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import Any, NamedTuple

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


class ErrorFileContent(NamedTuple):
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
    """Read a worker's error file; None when it is missing, empty or not in a known shape
    (see :func:`parse_error_document`). Never raises."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            data = json.load(fp)
    except (OSError, ValueError):
        return None
    return parse_error_document(data)


def parse_error_document(data: object) -> ErrorFileContent | None:
    """An error file's document; None when it is not in a known shape.

    Accepts torch's documented shape (``message`` a dict with ``message`` and
    ``extraInfo.py_callstack``/``timestamp``) and a plain string ``message`` (with an
    optional top-level ``timestamp``)."""
    if not isinstance(data, dict) or "message" not in data:
        return None
    body = data["message"]
    if isinstance(body, str):
        return ErrorFileContent(body, "", _seconds(data.get("timestamp")), data)
    if not isinstance(body, dict):
        return None
    extra = body.get("extraInfo")
    if not isinstance(extra, dict):
        extra = {}
    return ErrorFileContent(
        message=str(body.get("message", "")),
        traceback=str(extra.get("py_callstack", "")),
        timestamp=_seconds(extra.get("timestamp")),
        data=data,
    )


def _seconds(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
