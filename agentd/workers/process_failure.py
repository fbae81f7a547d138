"""torch's ``ProcessFailure``: a failure built from a pid, an exit code and an error file.

The agent describes its own workers' failures with :class:`~agentd.group.WorkerFailure`;
this subclass is what torch's users construct themselves, read exactly as torch reads it:

- an error file that exists is parsed, and one that is not JSON with a ``message`` is an
  error (``ValueError``); both of torch's shapes are read: ``{"message": "<text>",
  "timestamp": <seconds>}`` and the ``@record`` shape (``message.extraInfo.timestamp``);
- without one, ``error_file`` is ``"<N/A>"`` and ``message`` says what happened: the signal
  and pid for a death by signal, else where to read about enabling tracebacks;
- ``timestamp`` is whole epoch seconds (the error file's, else now), ``signal_name()`` is
  ``"<N/A>"`` for an exit that was not a signal.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass

from agentd.errors.error_file import parse_error_document
from agentd.group import WorkerFailure

NOT_AVAILABLE = "<N/A>"
TRACEBACK_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


@dataclass
class ProcessFailure(WorkerFailure):
    """``ProcessFailure(local_rank, pid, exitcode, error_file)``, as torch's (see module)."""

    def __post_init__(self) -> None:
        if self.error_file and os.path.isfile(self.error_file):
            self._read(self.error_file)
        else:
            self.error_file = NOT_AVAILABLE
            if self.exitcode < 0:
                self.message = (
                    f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
                )
            else:
                self.message = TRACEBACK_HINT
        self.timestamp = int(self.timestamp or time.time())

    def _read(self, path: str) -> None:
        with open(path, encoding="utf-8") as fp:
            content = parse_error_document(json.load(fp))  # not JSON: raises, as torch's
        if content is None:
            raise ValueError(f"error_file: {path!r} must be a JSON object with a 'message'")
        self.error_file_data = content.data
        self.message, self.traceback = content.message, content.traceback
        if content.timestamp is not None:
            self.timestamp = int(content.timestamp)

    def timestamp_isoformat(self) -> str:
        """When it failed, local time, as ``YYYY-MM-DD_HH:MM:SS`` (torch's)."""
        import datetime

        return datetime.datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    def signal_name(self) -> str:
        if self.exitcode >= 0:
            return NOT_AVAILABLE
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"
