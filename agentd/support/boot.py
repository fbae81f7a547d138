"""This machine's boot: what tells one boot's monotonic clock and ``/dev/shm`` from the next."""

from __future__ import annotations

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """The kernel's id of this boot (None: unreadable, as off Linux). A monotonic time or
    a shared-memory segment is only this boot's."""
    try:
        with open(BOOT_ID_FILE) as fp:
            return fp.read().strip()
    except OSError:
        return None
