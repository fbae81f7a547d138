"""Followers of one of an agent's endpoints: clients that ask again and again until the
agent's run is over (``agentd logs --follow`` asks ``/logs`` every second, ``agentd
status --job --watch`` asks ``/job`` every few seconds).

A follower says so, and how often it asks, in the :data:`FOLLOW_HEADER` header (a header,
not a query parameter, which an agent of a version before it would refuse). The agent's
end waits for each endpoint's followers to be told that the run ended
(:meth:`Followers.end`): without that wait the endpoint closed with the agent, between
two of a follower's requests, and the follower lost the run's end (the last lines, the
final state) and ended in an error ("cannot reach") though the job had ended well.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping

FOLLOW_HEADER = "Agentd-Follow"
"""A follower's request carries it: the seconds between its requests (``1``: every
second)."""
MARGIN = 2.0
"""Beyond a follower's own interval, how long its next request may take to come (a
loaded machine, a slow network): the end waits for it until then."""
LONGEST = 5.0
"""A follower that asks less often than this is not waited for: an agent's exit is not
held longer than this (and :data:`MARGIN`) for anyone. It finds the agent gone."""


def follow_interval(headers: Mapping[str, str]) -> float | None:
    """The seconds between a follower's requests, from a request's ``headers`` (None: not
    a follower's, or a value that is no interval, which is no follower's)."""
    text = headers.get(FOLLOW_HEADER)
    if text is None:
        return None
    try:
        every = float(text)
    except ValueError:
        return None
    return every if math.isfinite(every) and every > 0 else None


class Followers:
    """Whether the agent's run has ended, and the followers of one endpoint: the end
    waits for a follower still following to be answered that the run ended, at most
    until its interval (no more than :data:`LONGEST`) and :data:`MARGIN` after its last
    request (one gone, a Ctrl-C, asks no more). Nobody following costs the end nothing."""

    def __init__(self) -> None:
        self.ended = False
        self._deadline: float | None = None
        self._told = asyncio.Event()

    def asked(self, every: float | None) -> bool:
        """A request came, a follower's asking every ``every`` seconds (None: not a
        follower's): whether the run had ended before it was answered (read it before
        reading what the answer holds, so that nothing after the read is missed)."""
        if every is not None and every <= LONGEST:
            self._deadline = time.monotonic() + every + MARGIN
        return self.ended

    def told(self) -> None:
        """A follower was answered that the run ended, and all of it (no more to read)."""
        self._told.set()

    async def end(self) -> None:
        """The run is over: answer so from now on, and wait for a recent follower."""
        self.ended = True
        if self._deadline is None:
            return
        left = self._deadline - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._told.wait(), left)
