"""The clock a store's TTLs run on: serving time, which a freeze or a starved loop stops.

A store frozen (SIGSTOP) or starved must not expire, on resume, the heartbeats its clients
sent meanwhile: it reads the clock at least every :data:`TICK` while it holds TTL keys, so
a longer gap between two readings can only be a stall, and counts as :data:`STALL`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

STALL = 2.0
"""The most serving time one gap between two readings of the clock may count."""
TICK = 1.0
"""While TTL keys exist, the clock is read this often, so only a stall makes a long gap."""


class ServingClock:
    """Seconds the store has been serving: ``clock`` time, except that a gap of more than
    ``stall`` seconds between two readings (the process was frozen, or the loop starved)
    counts as ``stall``. The store reads it at least every :data:`TICK` while it has TTL
    keys, so a longer gap can only be a stall."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        stall: float = STALL,
        on_stall: Callable[[float], None] | None = None,
    ) -> None:
        self._clock = clock
        self._stall = stall
        self._on_stall = on_stall
        self._last = clock()
        self._serving = 0.0
        self.stalled = 0.0
        """Seconds left uncounted so far."""

    def __call__(self) -> float:
        now = self._clock()
        step, self._last = now - self._last, now
        if step > self._stall:
            self.stalled += step - self._stall
            if self._on_stall is not None:
                self._on_stall(step)
            step = self._stall
        self._serving += max(0.0, step)
        return self._serving
