"""What ``/proc/PID/stat`` says of a process: its state, a zombie's exit status, and the
CPU and memory of a process tree."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

STATES = {
    "T": "stopped",
    "t": "stopped by a tracer",
    "D": "in an uninterruptible wait",
    "S": "sleeping",
    "R": "running",
    "Z": "a zombie",
}
"""A state letter in words, for messages about a process that does not answer."""


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name, the state first
    (``[]``: the process is gone, or its file unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read().decode(errors="replace")
    except OSError:
        return []
    return line[line.rfind(")") + 2 :].split()


def state_in_words(pid: int) -> str:
    """``pid``'s state as :data:`STATES` says it ("gone" when it is)."""
    fields = stat_fields(pid)
    return STATES.get(fields[0], fields[0]) if fields else "gone"


def zombie_status(pid: int) -> int | None:
    """The exit code (negative: the signal) of ``pid`` where it is a zombie nobody reaped
    yet: the kernel keeps its wait status in ``/proc/PID/stat`` (field 52, Linux 3.5 on).
    None otherwise. A pid is not reused before its zombie is reaped."""
    fields = stat_fields(pid)
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


def runs_in_group(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs: one that exited and waits as a zombie
    for its parent to reap it does not."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


class ProcessTable:
    """Every process of the host, read from ``/proc`` in one pass (each stat once): who
    is whose child, and each one's CPU seconds and resident bytes. A tree walk per root
    (psutil's ``children``) reads all of ``/proc`` for each root: on a host of a thousand
    processes and eight workers, that held an agent's loop 0.3 s at each ``/status`` (31 ms
    now: ``bench/bench_status.py``)."""

    MAX_AGE = 1.0
    """Seconds :meth:`recent` hands out the same table (a watcher polling ``/status`` in a
    loop read all of ``/proc`` at each request)."""
    _recent: ProcessTable | None = None

    @classmethod
    def recent(cls, roots: Iterable[int]) -> ProcessTable:
        """A table read in the last :data:`MAX_AGE` seconds that has every one of ``roots``
        (a process started since is never missed), else a new one."""
        table = cls._recent
        fresh = table is not None and time.monotonic() - table.read_at <= cls.MAX_AGE
        if table is None or not fresh or any(root not in table.usage for root in roots):
            table = cls._recent = cls()
        return table

    def __init__(self) -> None:
        self.read_at = time.monotonic()
        ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
        self.usage: dict[int, tuple[float, int]] = {}
        self.children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:  # os.read: through a buffered file object the pass took twice as long
                fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
                try:
                    line = os.read(fd, 4096)
                finally:
                    os.close(fd)
            except OSError:
                continue  # gone meanwhile
            fields = line[line.rfind(b")") + 2 :].split()
            if len(fields) < 22:
                continue  # not a stat line this kernel writes
            pid = int(name)
            self.usage[pid] = ((int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * page)
            self.children.setdefault(int(fields[1]), []).append(pid)

    def tree(self, root: int) -> set[int]:
        """``root`` and its descendants (empty: ``root`` is gone)."""
        found: set[int] = set()
        todo = [root] if root in self.usage else []
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(self.children.get(pid, ()))
        return found

    def tree_usage(self, root: int) -> tuple[float, int]:
        """CPU seconds and resident bytes of ``root`` and its descendants (0, 0: gone)."""
        tree = [self.usage[pid] for pid in self.tree(root)]
        return sum(cpu for cpu, _ in tree), sum(rss for _, rss in tree)
