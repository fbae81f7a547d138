"""Worker output: where each stream goes (file, console, both), whole-line prefixes, tails.

Layout: ``<log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}``;
every attempt has its own directory, so a restart never overwrites what came before.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

TAIL_BYTES = 16 * 1024


def attempt_dir(run_dir: Path, attempt: int, local_rank: int) -> Path:
    """The directory of one worker's files for one attempt."""
    return run_dir / f"attempt_{attempt}" / str(local_rank)


@dataclass(frozen=True)
class StreamRoute:
    """Where one worker stream goes.

    ``inherit`` hands the agent's own descriptor to the worker (no copy at all); otherwise
    the agent reads a pipe and copies each chunk to ``file_path`` and ``console``. With a
    ``prefix``, console output is whole lines, each prefixed; without one, chunks pass
    through as they come (progress bars with ``\\r`` keep working).
    """

    file_path: Path | None = None
    console: BinaryIO | None = None
    prefix: bytes | None = None
    keep_tail: bool = False
    inherit: bool = False

    @property
    def piped(self) -> bool:
        return not self.inherit and (
            self.file_path is not None or self.console is not None or self.keep_tail
        )


def plan_route(
    *,
    redirect: bool,
    tee: bool,
    shown: bool,
    is_stderr: bool,
    file_path: Path,
    prefix: str,
) -> StreamRoute:
    """Decide a stream's route from torchrun's settings for one local rank.

    ``redirect``: to the log file only; ``tee``: to the log file and, prefixed, to the
    console; neither: straight to the console. ``shown`` is False for ranks outside
    ``--local-ranks-filter``, whose output never reaches the console. stderr is always read
    by the agent (when not inherited) so a failure report can quote its last lines.
    """
    console = (sys.stderr if is_stderr else sys.stdout).buffer if shown else None
    if tee:
        return StreamRoute(file_path, console, prefix.encode(), keep_tail=is_stderr)
    if redirect:
        return StreamRoute(file_path, None, None, keep_tail=is_stderr)
    if not is_stderr and shown:
        return StreamRoute(inherit=True)
    return StreamRoute(None, console, None, keep_tail=is_stderr)


class StreamSink:
    """Copies one worker stream, chunk by chunk as it arrives, to its route.

    Never splits a prefixed line: a partial line waits for its end (or the end of the
    stream). Keeps the last bytes when asked, for failure reports.
    """

    def __init__(self, route: StreamRoute) -> None:
        self._route = route
        self._tail = bytearray()
        self._partial = b""
        self._file = open(route.file_path, "ab", buffering=0) if route.file_path else None  # noqa: SIM115
        self.bytes = 0
        self.closed = False

    def tail(self, max_lines: int = 20) -> str:
        """The last ``max_lines`` lines seen on this stream (only when ``keep_tail``)."""
        lines = bytes(self._tail).decode(errors="replace").splitlines()
        return "\n".join(lines[-max_lines:])

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self._file is not None:
            self._file.write(chunk)
        if self._route.keep_tail:
            self._tail += chunk
            del self._tail[:-TAIL_BYTES]
        if self._route.console is not None:
            self._to_console(chunk)

    def close(self) -> None:
        """End of stream: flush a partial prefixed line and close the log file."""
        if self.closed:
            return
        self.closed = True
        if self._partial and self._route.console is not None:
            self._write_console((self._route.prefix or b"") + self._partial + b"\n")
        self._partial = b""
        if self._file is not None:
            self._file.close()

    def _to_console(self, chunk: bytes) -> None:
        prefix = self._route.prefix
        if prefix is None:
            self._write_console(chunk)
            return
        data = self._partial + chunk
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if cut:
            lines = data[:cut].splitlines(keepends=True)
            self._write_console(b"".join(prefix + line for line in lines))

    def _write_console(self, data: bytes) -> None:
        console = self._route.console
        assert console is not None
        try:
            console.write(data)
            console.flush()
        except (OSError, ValueError):
            pass  # a closed console must not stop the copy to the log file


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to the user; returns it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
