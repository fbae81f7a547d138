"""Restart policy: how many restarts, which exits are final, and the backoff between tries."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from agentd.exceptions import field_error


@dataclass(frozen=True)
class RestartBackoff:
    """Exponential backoff with jitter and a cap, between restarts of a failed group.

    The n-th consecutive restart (n >= 1) waits ``initial * factor**(n-1)`` seconds, capped
    at ``maximum``, then spread by up to ``jitter`` (a ratio) either way. ``initial == 0``
    restarts at once, as torchrun does. The count of consecutive failures starts again after
    an attempt that stayed healthy for ``maximum`` seconds: that is the crash-loop guard, a
    job crashing in a loop slows down to one try per ``maximum`` seconds.
    """

    initial: float = 0.0
    maximum: float = 60.0
    factor: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for value in (self.initial, self.maximum, self.factor, self.jitter):
            if not math.isfinite(value):  # nan passed every rule below; inf never restarted
                raise field_error("restart_backoff", value, "must be finite numbers")
        if self.initial < 0:
            raise field_error("restart_backoff", self.initial, "must be >= 0 seconds")
        if self.maximum < self.initial:
            raise field_error("restart_backoff", self.maximum, "max must be >= the initial delay")
        if self.factor < 1:
            raise field_error("restart_backoff", self.factor, "factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise field_error("restart_backoff", self.jitter, "jitter must be within [0, 1]")

    @classmethod
    def parse(cls, text: str) -> RestartBackoff:
        """Parse ``INITIAL[:MAX[:FACTOR[:JITTER]]]`` (seconds, seconds, ratio, ratio)."""
        parts = text.split(":")
        if not 1 <= len(parts) <= 4:
            raise field_error("restart_backoff", text, "must be INITIAL[:MAX[:FACTOR[:JITTER]]]")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            raise field_error(
                "restart_backoff", text, "must be numbers: INITIAL[:MAX[:FACTOR[:JITTER]]]"
            ) from None
        initial = numbers[0]
        maximum = numbers[1] if len(numbers) > 1 else max(60.0, initial)
        factor = numbers[2] if len(numbers) > 2 else 2.0
        jitter = numbers[3] if len(numbers) > 3 else 0.1
        return cls(initial, maximum, factor, jitter)

    def delay(self, consecutive_failures: int, rand: Callable[[], float] | None = None) -> float:
        """Seconds to wait before the restart that follows ``consecutive_failures`` failures
        (``rand``: a uniform draw in [0, 1), by default :func:`random.random`)."""
        if self.initial == 0 or consecutive_failures < 1:
            return 0.0
        if rand is None:
            import random  # here: only a backoff draws, and its import costs every launch

            rand = random.random
        base = min(self.maximum, self.initial * self.factor ** (consecutive_failures - 1))
        spread = base * self.jitter * (2 * rand() - 1)
        return max(0.0, min(self.maximum, base + spread))


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed group is restarted, and after how long."""

    max_restarts: int = 0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    non_retryable_exit_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise field_error("max_restarts", self.max_restarts, "must be >= 0")

    def is_retryable(self, exitcode: int | None) -> bool:
        """A failure is retried unless its exit code is listed as non-retryable."""
        return exitcode not in self.non_retryable_exit_codes
