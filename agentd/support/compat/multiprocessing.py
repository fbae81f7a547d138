"""multiprocessing's private parts: a process's ``_inheriting`` flag, and a queue's pipe."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def inheriting() -> Iterator[None]:
    """Within the block, this process unpickles what its parent sent, as a child that
    multiprocessing spawned does (``process._inheriting``: locks and queues unpickle only
    then)."""
    from multiprocessing import process

    current = process.current_process()
    current._inheriting = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del current._inheriting  # type: ignore[attr-defined]


def queue_reader_fd(queue: Any) -> int:
    """The descriptor a ``multiprocessing.Queue`` is read from (``queue._reader``), to
    watch on an event loop; TypeError for anything else."""
    reader = getattr(queue, "_reader", None)
    if reader is None:
        raise TypeError("mp_queue: must be a multiprocessing.Queue")
    return int(reader.fileno())
