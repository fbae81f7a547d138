"""The control file: how an agent tells its workers about a drain, read at every step.

A file of :data:`SIZE` bytes per attempt, its path in ``$AGENTD_CONTROL_FILE``: the drain's
id (0: none) and the step every rank checkpoints at (-1: not chosen yet), two little-endian
int64s. The agent writes it with one ``pwrite``; a worker maps it and reads 16 bytes per
step, so asking costs well under a microsecond and no system call.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct

log = logging.getLogger(__name__)

CONTROL_ENV = "AGENTD_CONTROL_FILE"
NAME = "drain.control"
"""The file's name, in the run directory (or the agent's private runtime directory)."""
_LAYOUT = struct.Struct("<qq")
SIZE = _LAYOUT.size
NO_STEP = -1


def create(path: str) -> None:
    """A fresh control file: no drain. An earlier attempt's is written over in place (no
    truncation: a kept worker that maps it reads the reset, never a shorter file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.pwrite(fd, _LAYOUT.pack(0, NO_STEP), 0)
        if os.fstat(fd).st_size != SIZE:
            os.ftruncate(fd, SIZE)
    finally:
        os.close(fd)


def create_for_attempt(places: list[str], current: str | None, attempt: int) -> str | None:
    """The control file of ``attempt``: ``current`` again where it is one of ``places``
    (made by an earlier attempt: its kept workers map it), else the first of ``places``
    that can be created; None, with a WARNING, where none can."""
    if current in places:
        places = [current]
    problems = []
    for path in places:
        try:
            create(path)
        except OSError as exc:
            problems.append(f"{path} ({exc.strerror or exc})")
            continue
        if problems:
            log.warning(
                "Could not create the drain control file %s: attempt %d's is %s",
                "; ".join(problems),
                attempt,
                path,
            )
        return path
    log.warning(
        "Could not create the drain control file %s: a drain of attempt %d stops its "
        "workers without asking them to checkpoint",
        "; ".join(problems),
        attempt,
    )
    return None


def publish(path: str, drain_id: int, step: int = NO_STEP) -> None:
    """Tell the workers: drain ``drain_id``, at ``step`` (NO_STEP: report yours first)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, _LAYOUT.pack(drain_id, step), 0)
    finally:
        os.close(fd)


class ControlView:
    """A worker's read-only view of the control file."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def read(self) -> tuple[int, int]:
        """(drain id, step): (0, NO_STEP) while there is no drain."""
        return _LAYOUT.unpack_from(self._map)  # type: ignore[return-value]


def open_view() -> ControlView | None:
    path = os.environ.get(CONTROL_ENV)
    if not path:
        return None
    try:
        return ControlView(path)
    except (OSError, ValueError):
        return None
