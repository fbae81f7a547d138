"""Was a worker killed for running out of memory? The kernel's word, read where it is kept.

A worker the OOM killer takes dies of SIGKILL, which alone says nothing. Two sources tell
more, and :class:`OomWatch` reads both when a worker dies that way:

- the memory cgroup the agent (and so its workers) runs in: its OOM-kill counter
  (v2 ``memory.events`` ``oom_kill``, v1 ``memory.oom_control`` ``oom_kill``), read when
  the workers start and again at the death, with the cgroup's limit (``memory.max`` /
  ``memory.limit_in_bytes``, the tightest of the cgroup and its ancestors) and its peak
  (``memory.peak`` / ``memory.max_usage_in_bytes``);
- the kernel log (``/dev/kmsg``, where readable: root, or ``kernel.dmesg_restrict=0``):
  the OOM killer's record names the pid it killed and its resident memory at that moment.

Either one is enough to name the cause; what is unreadable is left out, never guessed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

_NO_LIMIT = 2**62  # v1 reports "no limit" as a page-rounded 2**63 - 1
_KMSG = "/dev/kmsg"
_KILLED = (
    r"(?P<scope>Memory cgroup out of memory|Out of memory)?:? ?Killed process (?P<pid>\d+) "
    r"\((?P<comm>[^)]*)\).*?anon-rss:(?P<anon>\d+)kB, file-rss:(?P<file>\d+)kB, "
    r"shmem-rss:(?P<shmem>\d+)kB"
)
"""The OOM killer's record in the kernel log (compiled at the first death by SIGKILL:
most runs never read it)."""


class MemoryCgroup(NamedTuple):
    """One memory cgroup's directory, and which cgroup version's files it holds."""

    path: Path
    version: int
    name: str
    """The cgroup's path as ``/proc/<pid>/cgroup`` shows it."""

    @classmethod
    def of(cls, pid: int | str = "self", root: Path = Path("/")) -> MemoryCgroup | None:
        """The memory cgroup ``pid`` is in (None where there is none to read).
        ``root`` stands for ``/`` (tests point it at a copy of ``/proc`` and ``/sys``)."""
        try:
            lines = (root / f"proc/{pid}/cgroup").read_text().splitlines()
            mounts = (root / "proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return None
        v2_name = None
        for line in lines:
            _, controllers, name = line.split(":", 2)
            if "memory" in controllers.split(","):
                found = _mounted(
                    mounts,
                    name,
                    lambda fs, opts: fs == "cgroup" and "memory" in opts.split(","),
                    root,
                )
                return cls(found, 1, name) if found is not None else None
            if controllers == "":
                v2_name = name
        if v2_name is not None:
            found = _mounted(mounts, v2_name, lambda fs, _opts: fs == "cgroup2", root)
            if found is not None and (found / "memory.events").exists():
                return cls(found, 2, v2_name)
        return None

    def oom_kills(self) -> int | None:
        """How many processes of this cgroup (and those below it) the OOM killer took."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _field(self.path / name, "oom_kill")

    def limit(self) -> int | None:
        """The tightest memory limit of this cgroup and its ancestors (None: unlimited)."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        limits = []
        path = self.path
        while (path / name).exists():
            value = _number(path / name)
            if value is not None and value < _NO_LIMIT:
                limits.append(value)
            if path.parent == path:
                break
            path = path.parent
        return min(limits, default=None)

    def peak(self) -> int | None:
        """The cgroup's highest memory use so far (None where the kernel keeps none)."""
        return _number(
            self.path / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        )


class KernelOomKill(NamedTuple):
    """The kernel's record of one OOM kill."""

    pid: int
    rss_bytes: int
    in_cgroup: bool
    """The kill enforced a cgroup's limit (else the whole machine ran out)."""


def kernel_oom_kills(since: float, path: str = _KMSG) -> dict[int, KernelOomKill]:
    """The OOM killer's records in the kernel log since ``since`` (``time.monotonic()``
    seconds, the kernel log's clock), by pid; empty where the log is not readable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    found: dict[int, KernelOomKill] = {}
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: go on
                    continue
                break  # EAGAIN: the end; anything else: no more to read
            if not record:
                break
            # /dev/kmsg gives one record a read; a copy of it in a file, many lines.
            for line in record.decode("utf-8", "replace").splitlines():
                kill = _parse_record(line, since)
                if kill is not None:
                    found[kill.pid] = kill
    finally:
        os.close(fd)
    return found


def _parse_record(record: str, since: float) -> KernelOomKill | None:
    head, _, text = record.partition(";")
    fields = head.split(",")
    if len(fields) < 3 or "Killed process" not in text:
        return None
    with contextlib.suppress(ValueError):
        if int(fields[2]) / 1e6 < since:
            return None
    match = re.search(_KILLED, text)  # re caches the compiled pattern
    if match is None:
        return None
    rss_kb = sum(int(match[k]) for k in ("anon", "file", "shmem"))
    return KernelOomKill(
        int(match["pid"]), rss_kb * 1024, in_cgroup=match["scope"] == "Memory cgroup out of memory"
    )


class OomWatch:
    """Tells whether a worker that died of SIGKILL was the OOM killer's: call :meth:`arm`
    as the workers start, :meth:`explain` as one of them is found dead."""

    def __init__(self, kmsg: str = _KMSG, root: Path = Path("/")) -> None:
        self._kmsg = kmsg
        self._root = root
        self._cgroup: MemoryCgroup | None = None
        self._kills_before: int | None = None
        self._armed_at = 0.0

    def arm(self) -> None:
        """Note the cgroup's OOM-kill count now (the workers inherit the agent's cgroup)."""
        self._armed_at = time.monotonic()
        if self._cgroup is None:
            self._cgroup = MemoryCgroup.of("self", self._root)
        self._kills_before = self._cgroup.oom_kills() if self._cgroup is not None else None

    def explain(self, pid: int, exitcode: int) -> dict[str, Any] | None:
        """What is known of the OOM kill of worker ``pid`` (None: it was not one, as far
        as the kernel tells): ``cgroup``, ``limit_bytes``, ``peak_bytes``, ``rss_bytes``
        (resident at the kill) and ``scope`` ("cgroup" or "system"), each None if unknown."""
        if exitcode != -signal.SIGKILL:
            return None
        kernel = kernel_oom_kills(self._armed_at - 1.0, self._kmsg).get(pid)
        cgroup = self._cgroup
        counted = False
        if cgroup is not None and self._kills_before is not None:
            after = cgroup.oom_kills()
            counted = after is not None and after > self._kills_before
        if kernel is None and not counted:
            return None
        scope = None
        if kernel is not None:
            scope = "cgroup" if kernel.in_cgroup else "system"
        return {
            "scope": scope,
            "cgroup": cgroup.name if cgroup is not None else None,
            "limit_bytes": cgroup.limit() if cgroup is not None else None,
            "peak_bytes": cgroup.peak() if cgroup is not None else None,
            "rss_bytes": kernel.rss_bytes if kernel is not None else None,
        }


def describe(oom: dict[str, Any]) -> str:
    """One line for the report: ``out of memory (cgroup limit 256 MiB, peak 256 MiB, ...)``."""
    facts = []
    if oom.get("limit_bytes") is not None:
        facts.append(f"cgroup limit {_size(oom['limit_bytes'])}")
    elif oom.get("scope") == "system":
        facts.append("the machine ran out")
    if oom.get("peak_bytes") is not None:
        facts.append(f"peak {_size(oom['peak_bytes'])}")
    if oom.get("rss_bytes") is not None:
        facts.append(f"resident {_size(oom['rss_bytes'])} when killed")
    return "out of memory" + (f" ({', '.join(facts)})" if facts else "")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


def _mounted(mounts: list[str], name: str, accepts: Any, root: Path) -> Path | None:
    """The directory of cgroup ``name`` under the first mount ``accepts(fstype, options)``."""
    for line in mounts:
        left, _, right = line.partition(" - ")
        parts, tail = left.split(), right.split()
        if len(parts) < 5 or len(tail) < 3 or not accepts(tail[0], tail[2]):
            continue
        mount_root, mount_point = parts[3], parts[4]
        if mount_root != "/" and (name + "/").startswith(mount_root.rstrip("/") + "/"):
            name = name[len(mount_root.rstrip("/")) :] or "/"
        return root / mount_point.lstrip("/") / name.lstrip("/")
    return None


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _field(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
