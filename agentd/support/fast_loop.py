"""The event loop of a process that serves thousands of connections: uvloop's, where it
is installed (a dependency of agentd on Linux and macOS), else asyncio's own.

Only ``agentd store`` runs on it. A store of 4,096 rendezvous handlers spent 400 us of
CPU per join on asyncio's loop and 280 on uvloop's (``bench/bench_rdzv.py``); an agent
waits on its workers, signals and pipes, where the loop's speed does not show, so agents
keep asyncio's loop (and its start-up budget: uvloop is never imported there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agentd.exceptions import ConfigError

T = TypeVar("T")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``choice`` (``auto``: uvloop's where installed; ``uvloop``;
    ``asyncio``); None is asyncio's. uvloop asked for but not installed is a ConfigError."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--loop: 'uvloop' is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names (see :func:`loop_factory`)."""
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never awaited
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: whose loop ``loop`` is."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
