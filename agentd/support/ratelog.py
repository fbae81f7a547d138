"""Logging that a flood cannot turn into a flood of log lines.

A fault that repeats per connection, per request or per chunk of output (a slowloris, a
full disk, a fuzzer) is logged once per interval and kind, with the count of what was
left out since, never once per occurrence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any


class RateLimitedLog:
    """Log each ``kind`` of problem at most once per ``interval`` seconds.

    The next line of a kind says how many were held back since the previous one, so
    nothing is lost from the count, only from the log.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        """Every occurrence, by kind, logged or held back."""

    def __call__(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args`` unless ``kind`` was logged less than ``interval`` ago;
        returns whether it was logged."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        if held and last is not None:
            message += " (%d more like it in the last %.0fs)"
            args = (*args, held, now - last)
        self._log.log(level, message, *args)
        return True

    def warning(self, kind: str, message: str, *args: object) -> bool:
        return self(logging.WARNING, kind, message, *args)

    def error(self, kind: str, message: str, *args: object) -> bool:
        return self(logging.ERROR, kind, message, *args)


def rate_limited_loop_errors(interval: float = 10.0) -> Callable[..., None]:
    """An asyncio exception handler that logs each kind of error once per interval.

    asyncio reports some failures again and again: the first of a kind is logged with its
    traceback, the rest are counted into the next line of their kind. ``socket.accept()
    out of system resource`` (once a second while a flood holds every descriptor) is a
    client's doing, not a bug: one WARNING line per interval, never a traceback.
    """
    problems = RateLimitedLog(logging.getLogger("asyncio"), interval)
    seen: set[str] = set()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "unhandled error in the event loop"))
        exc = context.get("exception")
        kind = f"{message}: {type(exc).__name__}" if exc else message
        if message.startswith("socket.accept() out of system resource"):  # a flood, no bug
            said = "A listener ran out of descriptors (%s); asyncio accepts on it again in 1 s"
            problems.warning(kind, said, exc)
            return
        if kind not in seen:
            seen.add(kind)
            loop.default_exception_handler(context)
            problems(logging.ERROR, kind, "%s%s", message, f" ({exc!r})" if exc else "")
            return
        problems(logging.ERROR, kind, "%s%s", message, f" ({exc!r})" if exc else "")

    return handler
