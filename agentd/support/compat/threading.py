"""threading's private part: what the interpreter does with threads on its way out."""

from __future__ import annotations


def join_non_daemon_threads() -> None:
    """Wait for every non-daemon thread, as the interpreter does before it exits
    (``threading._shutdown``), for a process that leaves by ``os._exit``."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
