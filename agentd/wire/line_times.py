"""When a worker's log file got its bytes: the line-times file the agent keeps beside it.

``<attempt dir>/<local rank>/stdout.log.times`` (and ``stderr.log.times``), text, appended
as the agent copies the stream to its log file::

    agentd-line-times 1 rank=5 attempt=2
    0 1795940093.688
    8192 1795940094.103

A record ``OFFSET TIME``: the log file's bytes from OFFSET on were written at TIME or
later (wall clock, seconds). One is written for a chunk that arrives :data:`INTERVAL` or
more after the last record, so a line's time, the last record at or before its start, is
never more than :data:`INTERVAL` early, and a chatty worker costs at most 20 records a
second. ``agentd logs`` merges every node's lines in time order by them
(:mod:`agentd.joblogs`).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

MAGIC = "agentd-line-times 1"
SUFFIX = ".times"
INTERVAL = 0.05
"""The most a line's time may be early (seconds)."""


class LineTimes(NamedTuple):
    """A parsed line-times file: its worker's global rank and attempt, and the records."""

    rank: int | None
    attempt: int | None
    offsets: list[int]
    times: list[float]

    def time_at(self, offset: int, default: float) -> float:
        """When the byte at ``offset`` was written (``default`` before the first record)."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        return self.times[i] if i >= 0 else default


def header(rank: int, attempt: int) -> bytes:
    return f"{MAGIC} rank={rank} attempt={attempt}\n".encode()


def record(offset: int, at: float) -> bytes:
    return f"{offset} {at:.3f}\n".encode()


def parse(text: str) -> LineTimes:
    """Read a line-times file; a torn last record or a foreign line is skipped."""
    lines = text.split("\n")[:-1]  # the last is '' or a record still being written
    meta: dict[str, int] = {}
    if lines and lines[0].startswith(MAGIC):
        for field in lines[0][len(MAGIC) :].split():
            name, _, value = field.partition("=")
            if value.lstrip("-").isdigit():
                meta[name] = int(value)
    offsets: list[int] = []
    times: list[float] = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) != 2 or not fields[0].isdigit():
            continue
        try:
            at = float(fields[1])
        except ValueError:
            continue
        if offsets and int(fields[0]) < offsets[-1]:
            continue
        offsets.append(int(fields[0]))
        times.append(at)
    return LineTimes(meta.get("rank"), meta.get("attempt"), offsets, times)
