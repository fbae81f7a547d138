"""Whether a zygote still answers: a fork it leaves unanswered for :data:`FORK_ANSWER`
seconds, or a zygote stopped (SIGSTOP) for :data:`STOPPED_GRACE` seconds while the agent
waits on it (its preload, which may take a while, included), is
:class:`ZygoteUnresponsive`, and the agent replaces it."""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

from agentd.exceptions import StartError
from agentd.support.procfs import stat_fields, state_in_words

FORK_ANSWER = 10.0
"""Seconds a zygote may take to answer a fork (a fork takes milliseconds)."""
STOPPED_GRACE = 10.0
"""Seconds a zygote may stay stopped while the agent waits on it."""
_LOOK_EVERY = 0.5

T = TypeVar("T")


class ZygoteUnresponsive(StartError):
    """The zygote did not answer in time, or stayed stopped while the agent waited."""


class Answers(Protocol):
    pid: int | None
    answering: bool


async def answered(
    zygote: Answers, answer: asyncio.Future[T], what: str, deadline: float | None = None
) -> T:
    """``answer``'s result once the zygote gives it (never cancelled here); raises
    :class:`ZygoteUnresponsive` (and marks ``zygote`` as not ``answering``) after
    ``deadline`` seconds, or once it has been stopped for :data:`STOPPED_GRACE`."""
    loop = asyncio.get_running_loop()
    began, stopped_since = loop.time(), None
    while True:
        await asyncio.wait({answer}, timeout=_LOOK_EVERY)
        if answer.done():
            return answer.result()
        now, pid = loop.time(), zygote.pid or 0
        stopped = stat_fields(pid)[:1] == ["T"]
        stopped_since = (stopped_since or now) if stopped else None
        why = None
        if deadline is not None and now - began >= deadline:
            why = f"did not answer {what} in {deadline:g}s (it is {state_in_words(pid)})"
        elif stopped_since is not None and now - stopped_since >= STOPPED_GRACE:
            why = f"has been stopped for {STOPPED_GRACE:g}s during {what}"
        if why is not None:
            zygote.answering = False
            raise ZygoteUnresponsive(why)
