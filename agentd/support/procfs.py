"""What ``/proc/PID/stat`` says of a process: its state, and a zombie's exit status."""

from __future__ import annotations

import os

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
