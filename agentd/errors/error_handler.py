"""torch's ``ErrorHandler``: where a process's uncaught error is written, for its launcher.

``record_exception(exc)`` writes the ``@record`` error file to
``$TORCHELASTIC_ERROR_FILE`` (nothing without it); ``dump_error_file(path, error_code)``
copies a child's error file there instead (the child's error is the root cause), with
``errorCode`` set; ``initialize()`` turns on ``faulthandler`` so a crash in native code
still leaves a stack on stderr. ``get_error_handler()`` gives the handler ``@record`` uses.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
from typing import Any

from agentd.errors.error_file import ERROR_FILE_ENV, read_error_file, write_error_file

log = logging.getLogger(__name__)


class ErrorHandler:
    """Writes or copies the error file of the current process (see the module)."""

    def _get_error_file_path(self) -> str | None:
        return os.environ.get(ERROR_FILE_ENV)

    def initialize(self) -> None:
        """Dump Python stacks on fatal signals (faulthandler), to stderr."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as exc:  # no usable stderr (a daemon): not worth failing for
            log.warning("Could not enable faulthandler: %s", exc)

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` (with its traceback) to the error file, if one is configured."""
        write_error_file(e, self._get_error_file_path())

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a child's error file to ours, recording ``error_code`` in it."""
        path = self._get_error_file_path()
        content = read_error_file(rootcause_error_file)
        if not path or content is None:
            log.warning(
                "Not copying %s (no error file of ours, or nothing readable)", rootcause_error_file
            )
            return
        data = dict(content.data)
        if error_code:
            if isinstance(data.get("message"), dict):
                data["message"] = dict(data["message"])  # not the content's own
            self.override_error_code_in_rootcause_data(rootcause_error_file, data, error_code)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fp:
            json.dump(data, fp)
        os.replace(tmp, path)

    def override_error_code_in_rootcause_data(
        self, rootcause_error_file: str, rootcause_error: dict[str, Any], error_code: int = 0
    ) -> None:
        """torch's: set ``errorCode`` in the error file data ``rootcause_error`` (read from
        ``rootcause_error_file``), in place: the child could not record it when a signal
        ended it. Only the ``@record`` format whose ``message`` is an object has the field;
        another (a string ``message``, or none) is left as it is, with a warning."""
        message = rootcause_error.get("message")
        if isinstance(message, dict):
            message["errorCode"] = error_code
            return
        shape = "has no field 'message'" if message is None else "has a message of another form"
        log.warning(
            "child error file %s %s; its error code (%s) is not set",
            rootcause_error_file,
            shape,
            error_code,
        )


def get_error_handler() -> ErrorHandler:
    """The handler ``@record`` uses."""
    return ErrorHandler()
