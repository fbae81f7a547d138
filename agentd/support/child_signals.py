"""Signals the agent's children start with ignored: a drain signal that a scheduler sends
to every process of the job, which is the agent's to act on.

Slurm's ``--signal`` and ``scancel --signal`` reach every process of a job step, the
workers and the zygote included; a worker killed by the SIGUSR1 meant for its agent could
not save the checkpoint that the drain asks of it. The agent sets this once, before it
starts any process (``agentd run``: the ``--drain-on`` signals that do not also stop);
each child, forked for exec, ignores them. A worker that wants one installs its own
handler, as Python code may at any time; an ignored signal stays ignored across exec.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""Never ignored by a child, even when they drain the agent: the agent stops workers with
them, and a terminal or a container runtime sends them to the agent alone."""
_IGNORED: tuple[signal.Signals, ...] = ()


def ignore_in_children(signals: Iterable[signal.Signals]) -> None:
    """From now on, children start with ``signals`` ignored (the empty set: none)."""
    global _IGNORED
    _IGNORED = tuple(sorted(set(signals)))


def apply_in_child() -> None:
    """In a forked child, before exec: ignore the signals set above."""
    for sig in _IGNORED:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN)
