"""One agent's log files as lines: what ``GET /logs`` answers.

The files are the per-attempt worker logs (``<run dir>/attempt_<n>/<local rank>/
{stdout,stderr}.log``, written with ``--tee`` or ``--redirects``), each line timed by the
line-times file beside it (:mod:`agentd.wire.line_times`; a file without one has its
lines at the file's modification time). Lines are whole: a line still being written is
held back until its end arrives, except in an attempt that is over. A cursor (each file's
offset read so far) lets a caller ask again for what came since; a read stops at
:data:`MAX_BYTES`, and says there is more.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from agentd.wire import line_times

MAX_BYTES = 1 << 20
"""The most log bytes one read returns (the rest: ask again from its cursor)."""
STREAMS = ("stdout", "stderr")
ATTEMPT = re.compile(r"attempt_(\d+)\Z")
"""An attempt's folder's name: its number."""


class LogLine(NamedTuple):
    at: float
    attempt: int
    rank: int
    """The worker's global rank in that attempt (-1: not known)."""
    local_rank: int
    stream: str
    text: str

    def shown(self, host: str) -> str:
        """The line as ``agentd logs`` prints it: ``host:rank aN| text`` (``lN`` for a
        rank not known: local rank N)."""
        who = self.rank if self.rank >= 0 else f"l{self.local_rank}"
        return f"{host}:{who} a{self.attempt}| {self.text}\n"


class LogFile(NamedTuple):
    key: str
    """``<attempt>/<local rank>/<stream>``: the cursor's key."""
    path: Path
    attempt: int
    local_rank: int
    stream: str


def log_files(run_dir: Path) -> list[LogFile]:
    """Every worker log file of the run, oldest attempt first."""
    found: list[LogFile] = []
    try:
        attempts = sorted(
            (int(m.group(1)), entry.path)
            for entry in os.scandir(run_dir)
            if entry.is_dir() and (m := ATTEMPT.match(entry.name))
        )
    except OSError:
        return []
    for attempt, folder in attempts:
        try:
            ranks = sorted(int(e.name) for e in os.scandir(folder) if e.name.isdigit())
        except OSError:
            continue
        for local_rank in ranks:
            for stream in STREAMS:
                path = Path(folder) / str(local_rank) / f"{stream}.log"
                if path.exists():
                    key = f"{attempt}/{local_rank}/{stream}"
                    found.append(LogFile(key, path, attempt, local_rank, stream))
    return found


class LogReader:
    """Reads a run's log files from a cursor; keeps each line-times file's parse."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._times: dict[Path, tuple[float, line_times.LineTimes]] = {}
        self.files = 0
        """How many log files the last read found (0: this agent writes none)."""

    def read(
        self,
        cursor: dict[str, int],
        current_attempt: int,
        since: float | None = None,
        rank: int | None = None,
    ) -> tuple[list[LogLine], dict[str, int], bool]:
        """The lines after ``cursor`` (of ``rank`` only, and from time ``since`` on,
        when given), sorted by time; the cursor after them; whether more is left."""
        lines: list[LogLine] = []
        after = dict(cursor)
        budget, more = MAX_BYTES, False
        found = log_files(self.run_dir)
        self.files = len(found)
        for log in found:
            if budget <= 0:
                more = True
                break
            times = self._timing(log.path)
            if rank is not None and times.rank not in (rank, None):
                continue
            start = after.get(log.key)
            first = start is None
            if start is None:
                start = self._first_offset(times, since)
            got, end, left = self._read_file(log, times, start, budget, current_attempt, first)
            budget -= end - start
            after[log.key] = end
            more = more or left
            if since is not None:
                got = [line for line in got if line.at >= since]
            if rank is not None:
                got = [line for line in got if line.rank in (rank, -1)]
            lines += got
        lines.sort(key=lambda line: line.at)
        return lines, after, more

    def _timing(self, log_path: Path) -> line_times.LineTimes:
        path = log_path.with_name(log_path.name + line_times.SUFFIX)
        try:
            changed = path.stat().st_mtime
        except OSError:
            return line_times.LineTimes(None, None, [], [])
        cached = self._times.get(path)
        if cached is None or cached[0] != changed:
            try:
                parsed = line_times.parse(path.read_text(errors="replace"))
            except OSError:
                parsed = line_times.LineTimes(None, None, [], [])
            self._times[path] = cached = (changed, parsed)
        return cached[1]

    @staticmethod
    def _first_offset(times: line_times.LineTimes, since: float | None) -> int:
        """Where a first read from time ``since`` may start: the last record before it."""
        if since is None or not times.times:
            return 0
        i = max(0, next((i for i, t in enumerate(times.times) if t >= since), len(times.times)) - 1)
        return times.offsets[i]

    @staticmethod
    def _read_file(
        log: LogFile,
        times: line_times.LineTimes,
        start: int,
        budget: int,
        current_attempt: int,
        align: bool,
    ) -> tuple[list[LogLine], int, bool]:
        """The whole lines of ``log`` from ``start`` (``align``: it may fall inside a
        line, whose rest is skipped), the offset after them, and whether more is left."""
        try:
            with open(log.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                modified = os.fstat(file.fileno()).st_mtime
                file.seek(start)
                data = file.read(min(budget, max(0, size - start)))
        except OSError:
            return [], start, False
        read_to = start + len(data)
        over = log.attempt < current_attempt
        end = data.rfind(b"\n") + 1
        if over and start + len(data) == size:
            end = len(data)  # a finished worker's last line, with or without its end
        elif not end and len(data) >= MAX_BYTES:
            end = len(data)  # a line longer than a whole read: in pieces, as the console
        if align and start > 0 and not _at_line_start(log.path, start):
            skip = data.find(b"\n", 0, end) + 1  # a since-read began inside a line
            data, start, end = data[skip:], start + skip, end - skip
        rank = times.rank if times.rank is not None else -1
        out: list[LogLine] = []
        offset = start
        for raw in data[:end].split(b"\n"):
            if offset >= start + end:
                break  # the '' after the last line end
            # a progress bar's \r redraws: the line is what a terminal would show last
            text = raw.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode(errors="replace")
            at = times.time_at(offset, modified)
            out.append(LogLine(at, log.attempt, rank, log.local_rank, log.stream, text))
            offset += len(raw) + 1
        return out, start + end, read_to < size  # more: the budget cut the read short


def _at_line_start(path: Path, offset: int) -> bool:
    with open(path, "rb") as file:
        file.seek(offset - 1)
        return file.read(1) == b"\n"
