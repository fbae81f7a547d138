"""File descriptors: enough for the agent, a reserve for its workers, caps for its listeners.

At start the agent raises its soft ``RLIMIT_NOFILE`` to the hard limit (many hosts start
processes at 1024), and gives its workers back the limit it was started with, so they
see what they would see under torchrun. Each listener is capped at a number of
connections that leaves :func:`worker_reserve` descriptors free, and room for one burst of
accepts (:data:`ACCEPT_BURST`), so a flood of connections can never leave the agent
unable to spawn, pipe or log its workers, nor make ``accept()`` run out.
"""

from __future__ import annotations

import contextlib
import logging
import resource

log = logging.getLogger(__name__)

_CEILING = 1 << 20
"""Never ask for more than this, even under an unlimited hard limit."""
_ORIGINAL: tuple[int, int] | None = None
"""The limits this process was started with (set by :func:`raise_open_files_limit`)."""

BASE_RESERVE = 128
"""Descriptors the agent keeps for itself: its loop, logs, event log, guardian, store client."""
PER_WORKER = 8
"""What one worker costs the agent: two output pipes, two log files, a pidfd, and the
transient descriptors of a spawn."""


def raise_open_files_limit() -> int:
    """Raise the soft limit to the hard one (once); returns the soft limit now in force."""
    global _ORIGINAL
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if _ORIGINAL is None:
        _ORIGINAL = (soft, hard)
    target = _CEILING if hard == resource.RLIM_INFINITY else min(hard, _CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("Could not raise the open files limit from %d to %d: %s", soft, target, exc)
    return _CEILING if soft == resource.RLIM_INFINITY else soft


def restore_for_child() -> None:
    """In a forked worker, before exec: the open files limit the agent was started with."""
    if _ORIGINAL is not None:  # a failure leaves the raised limit: never fail a spawn over it
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, _ORIGINAL)


def worker_reserve(workers: int) -> int:
    """Descriptors kept free for ``workers`` workers and the agent itself."""
    return BASE_RESERVE + PER_WORKER * workers


ACCEPT_BURST = 128
"""Connections one listener may accept in one go: its listen backlog (``Limits.backlog``),
which asyncio accepts per wake-up before answering any. A connection over the cap is
accepted too, to be answered 503, so a cap leaves this much room below the limit."""


def listener_cap(wanted: int, soft_limit: int, reserve: int, share: float = 1.0) -> int:
    """At most ``wanted`` connections, and at most ``share`` of what the reserve and one
    accept burst leave (never below 8: a listener that accepts nothing is no listener)."""
    room = int((soft_limit - reserve - ACCEPT_BURST) * share)
    return max(8, min(wanted, room))
