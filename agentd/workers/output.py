"""Worker output: where each stream goes (file, console, both), whole-line prefixes, tails.

Layout: ``<log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}``;
every attempt has its own directory, so a restart never overwrites what came before.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

from agentd.support.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

TAIL_BYTES = 16 * 1024


def attempt_dir(run_dir: Path, attempt: int, local_rank: int) -> Path:
    """The directory of one worker's files for one attempt."""
    return run_dir / f"attempt_{attempt}" / str(local_rank)


class StreamRoute(NamedTuple):
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
    duplicate_filters: tuple[bytes, ...] = ()
    """torch's duplicate filters: lines containing any of these are also appended, with
    the prefix, to ``duplicate_path`` (one file for the attempt's workers)."""
    duplicate_path: Path | None = None
    duplicate_prefix: bytes = b""
    times_of: tuple[int, int] | None = None
    """With a log file: the worker's (global rank, attempt); when the file's bytes were
    written goes to ``<file>.times`` (see :mod:`agentd.wire.line_times`)."""

    @property
    def piped(self) -> bool:
        return not self.inherit and (
            self.file_path is not None
            or self.console is not None
            or self.keep_tail
            or self.duplicate_path is not None
        )


def plan_route(
    *,
    redirect: bool,
    tee: bool,
    shown: bool,
    is_stderr: bool,
    file_path: Path,
    prefix: str,
    duplicate_filters: tuple[str, ...] = (),
    duplicate_path: Path | None = None,
    times_of: tuple[int, int] | None = None,
) -> StreamRoute:
    """Decide a stream's route from torchrun's settings for one local rank.

    ``redirect``: to the log file only; ``tee``: to the log file and, prefixed, to the
    console; neither: straight to the console. ``shown`` is False for ranks outside
    ``--local-ranks-filter``, whose output never reaches the console. stderr is always read
    by the agent (when not inherited) so a failure report can quote its last lines.
    """
    console = (sys.stderr if is_stderr else sys.stdout).buffer if shown else None
    route = _plain_route(redirect, tee, shown, is_stderr, file_path, prefix, console)
    if route.file_path is not None:
        route = route._replace(times_of=times_of)
    if not duplicate_filters or duplicate_path is None:
        return route
    if route.inherit:  # the lines must pass through the agent to be filtered
        route = StreamRoute(None, console)
    return route._replace(
        duplicate_filters=tuple(f.encode() for f in duplicate_filters),
        duplicate_path=duplicate_path,
        duplicate_prefix=prefix.encode(),
    )


def _plain_route(
    redirect: bool,
    tee: bool,
    shown: bool,
    is_stderr: bool,
    file_path: Path,
    prefix: str,
    console: BinaryIO | None,
) -> StreamRoute:
    if tee:
        return StreamRoute(file_path, console, prefix.encode(), keep_tail=is_stderr)
    if redirect:
        return StreamRoute(file_path, None, None, keep_tail=is_stderr)
    if not is_stderr and shown:
        return StreamRoute(inherit=True)
    return StreamRoute(None, console, None, keep_tail=is_stderr)


class StreamSink:
    """Copies one worker stream, chunk by chunk as it arrives, to its route.

    Linear in the bytes copied, with bounded memory, whatever the worker writes:

    * a prefixed console line is never split while it is shorter than
      :data:`MAX_PARTIAL_LINE`; a longer one (output without newlines) is flushed in
      pieces of that size, each on a line of its own;
    * ``\r`` ends a console line like ``\n`` and is kept, so a progress bar redraws in
      place, behind its prefix;
    * the log file gets the bytes exactly as written. If it cannot be written (a full disk)
      the console copy and the tail go on, and one "log dir full" error is logged per
      interval for all streams; writing is tried again on later chunks.

    Keeps the last bytes when asked, for failure reports.
    """

    def __init__(self, route: StreamRoute) -> None:
        self._route = route
        self._after_line_end = rb"\g<0>" + (route.prefix or b"").replace(b"\\", b"\\\\")
        """The substitution that puts the prefix after each line end."""
        self._tail = bytearray()
        self._partial = bytearray()
        self._file = self._open(route.file_path) if route.file_path else None
        self._duplicates = self._open(route.duplicate_path) if route.duplicate_path else None
        self._dup_partial = bytearray()
        self._offset = self._file.tell() if self._file is not None else 0
        self._times: BinaryIO | None = None
        self._marked = float("-inf")
        self._mark_every = 0.0
        if route.times_of is not None:
            from agentd.wire import line_times  # only where a log file is written

            self._mark_every = line_times.INTERVAL
        self.bytes = 0
        self.lost_bytes = 0
        """Bytes the log file did not get (its disk was full, or it could not be opened)."""
        self.closed = False

    @staticmethod
    def _open(path: Path) -> BinaryIO | None:
        try:
            return open(path, "ab", buffering=0)  # closed in close()
        except OSError as exc:
            disk_problem(path, exc)
            return None

    def tail(self, max_lines: int = 20) -> str:
        """The last ``max_lines`` lines seen on this stream (only when ``keep_tail``)."""
        lines = bytes(self._tail).decode(errors="replace").splitlines()
        return "\n".join(lines[-max_lines:])

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self._route.file_path is not None:
            self._to_file(chunk)
        if self._route.keep_tail:
            self._tail += chunk
            del self._tail[:-TAIL_BYTES]
        if self._route.console is not None:
            self._to_console(chunk)
        if self._duplicates is not None:
            self._to_duplicates(chunk)

    def _to_duplicates(self, chunk: bytes) -> None:
        """Whole lines that contain a filter, prefixed, to the attempt's filtered file."""
        partial = self._dup_partial
        partial += chunk
        cut = partial.rfind(b"\n") + 1
        if not cut:
            del partial[: max(0, len(partial) - MAX_PARTIAL_LINE)]  # bounded, never matched
            return
        lines, filters = (
            bytes(partial[:cut]).splitlines(keepends=True),
            self._route.duplicate_filters,
        )
        del partial[:cut]
        out = b"".join(
            self._route.duplicate_prefix + line for line in lines if any(f in line for f in filters)
        )
        if out and self._duplicates is not None:
            try:
                self._duplicates.write(out)
            except OSError as exc:
                disk_problem(self._route.duplicate_path, exc)

    def close(self) -> None:
        """End of stream: flush a partial prefixed line and close the log file."""
        if self.closed:
            return
        self.closed = True
        if self._partial and self._route.console is not None:
            self._write_console(self._prefixed(self._partial, ended=False))
        self._partial = bytearray()
        if self._file is not None:
            self._file.close()
        if self._duplicates is not None:
            self._duplicates.close()
        if self._times is not None:
            self._times.close()

    def _to_file(self, chunk: bytes) -> None:
        file = self._file
        if file is None:
            self.lost_bytes += len(chunk)
            return
        if self._route.times_of is not None:
            self._mark_time()
        view = memoryview(chunk)
        try:
            while view:  # an unbuffered write may be short when the disk is nearly full
                written = file.write(view) or 0
                self._offset += written
                view = view[written:]
        except OSError as exc:
            self.lost_bytes += len(view)
            disk_problem(self._route.file_path, exc)

    def _mark_time(self) -> None:
        """A line-times record for the bytes about to be written, where the last record is
        :data:`~agentd.wire.line_times.INTERVAL` old or more."""
        now = time.time()
        if now - self._marked < self._mark_every:
            return
        from agentd.wire import line_times  # loaded by __init__: a dict lookup

        self._marked = now
        route = self._route
        assert route.file_path is not None and route.times_of is not None
        path = route.file_path.with_name(route.file_path.name + line_times.SUFFIX)
        try:
            if self._times is None:
                self._times = open(path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
                if self._times.tell() == 0:
                    self._times.write(line_times.header(*route.times_of))
            self._times.write(line_times.record(self._offset, now))
        except OSError as exc:  # the log goes on; its lines then have the file's time
            disk_problem(path, exc)

    def _to_console(self, chunk: bytes) -> None:
        prefix = self._route.prefix
        if prefix is None:
            self._write_console(chunk)
            return
        out = bytearray()
        partial = self._partial
        if partial[-1:] == b"\r":  # held back last time: was it the first half of \r\n?
            if chunk[:1] == b"\n":
                partial += b"\n"
                chunk = chunk[1:]
            out += prefix + partial
            partial.clear()
        # Everything up to the last line end goes out now, a prefix after each line end (one
        # substitution in C, not a loop per line). A \r at the very end may be half of a
        # \r\n: its line waits for the next chunk.
        last = len(chunk) - 1 if chunk.endswith(b"\r") else len(chunk)
        cut = max(chunk.rfind(b"\n", 0, last), chunk.rfind(b"\r", 0, last)) + 1
        if cut:
            body = _LINE_END.sub(self._after_line_end, chunk[:cut])
            out += prefix + partial + body[: len(body) - len(prefix)]
            partial.clear()
        partial += chunk[cut:]
        while len(partial) >= MAX_PARTIAL_LINE:  # no line end in sight: flush a piece
            out += self._prefixed(partial[:MAX_PARTIAL_LINE], ended=False)
            del partial[:MAX_PARTIAL_LINE]
        if out:
            self._write_console(bytes(out))

    def _prefixed(self, line: bytes | bytearray, ended: bool = True) -> bytes:
        """One console line: the prefix, the line, and a newline if it had no ending."""
        return (self._route.prefix or b"") + bytes(line) + (b"" if ended else b"\n")

    def _write_console(self, data: bytes) -> None:
        console = self._route.console
        assert console is not None
        try:
            console.write(data)
            console.flush()
        except (OSError, ValueError):
            pass  # a closed console must not stop the copy to the log file


MAX_PARTIAL_LINE = 64 * 1024
"""The longest console line held back waiting for its end; longer ones come in pieces."""
_LINE_END = re.compile(rb"\r\n|\n|\r")
_DISK_PROBLEMS = RateLimitedLog(log, interval=30.0)


def disk_problem(path: Path | None, exc: OSError) -> None:
    """Say once per interval, for every stream and attempt, that worker logs are lost."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    kind = "log dir full" if full else "log file unwritable"
    _DISK_PROBLEMS.error(
        kind,
        "%s: cannot write %s: %s; worker output still goes to the console and to failure reports",
        kind,
        path,
        exc.strerror,
    )


def prune_attempts(run_dir: Path, current: int, keep: int) -> list[int]:
    """Delete attempt directories but the first and the last ``keep`` (0: keep them all),
    so a crash-looping job's log dir stops growing; returns the attempts deleted."""
    if keep <= 0 or current <= keep:
        return []  # none old enough, as on every launch
    import shutil  # only here: it pulls in the compression modules

    doomed = []
    for path in run_dir.glob("attempt_*"):
        suffix = path.name.removeprefix("attempt_")
        if suffix.isdigit() and 0 < int(suffix) <= current - keep:
            shutil.rmtree(path, ignore_errors=True)
            doomed.append(int(suffix))
    return sorted(doomed)


STAGED_ATTEMPT = ".attempt_next"
"""The next attempt's worker directories, made while the current attempt runs: a restart
renames it into place (one metadata write) instead of making a directory per worker on
its path (each a journal write: 0.1-2 ms on ext4, more on a network file system)."""


def stage_next_attempt(run_dir: Path, local_ranks: Iterable[int]) -> None:
    """Make the next attempt's worker directories ahead, under :data:`STAGED_ATTEMPT`
    once they all exist (a failure is left to that attempt, which makes its own)."""
    partial = run_dir / f"{STAGED_ATTEMPT}.part"
    try:
        for rank in local_ranks:
            ensure_dir(partial / str(rank))
        os.rename(partial, run_dir / STAGED_ATTEMPT)
    except OSError:
        _remove_empty(partial)


def take_staged_attempt(run_dir: Path, attempt: int) -> bool:
    """The staged directories become ``attempt``'s, where they exist and it has none;
    whether they did."""
    try:
        os.rename(run_dir / STAGED_ATTEMPT, run_dir / f"attempt_{attempt}")
    except OSError:
        return False
    return True


def drop_staged_attempt(run_dir: Path) -> None:
    """Remove the staged directories (empty) when no attempt will follow."""
    _remove_empty(run_dir / STAGED_ATTEMPT)
    _remove_empty(run_dir / f"{STAGED_ATTEMPT}.part")


def _remove_empty(staged: Path) -> None:
    try:
        for rank_dir in staged.iterdir():
            rank_dir.rmdir()
        staged.rmdir()
    except OSError:
        return


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to the user; returns it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
