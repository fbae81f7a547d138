"""Hang detection without client code: a worker stuck in uninterruptible sleep (D state).

Enabled by ``--uninterruptible-timeout`` (torch's ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``).
The state is only visible by looking, so this one check runs once a second, and only when
it is enabled; it reports a worker that stayed in D state longer than the timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentd.support.aio import cancel_and_wait
from agentd.support.procfs import stat_fields

log = logging.getLogger(__name__)

CHECK_INTERVAL = 1.0


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``D``, ...), None if it is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


class UninterruptibleMonitor:
    """Calls ``on_stuck(pid, seconds)`` for a pid in D state for ``timeout`` seconds or more."""

    def __init__(
        self,
        pids: Callable[[], list[int]],
        timeout: float,
        on_stuck: Callable[[int, float], None],
        state: Callable[[int], str | None] = process_state,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pids = pids
        self.timeout = timeout
        self._on_stuck = on_stuck
        self._state = state
        self._clock = clock
        self._since: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    def check(self) -> None:
        """One look at every pid (the logic, testable with an injected state and clock)."""
        now = self._clock()
        seen = set()
        for pid in self._pids():
            if self._state(pid) != "D":
                continue
            seen.add(pid)
            since = self._since.setdefault(pid, now)
            if now - since >= self.timeout:
                log.error(
                    "Worker pid %d has been in uninterruptible sleep for %.1fs", pid, now - since
                )
                self._on_stuck(pid, now - since)
                self._since[pid] = float("inf")  # report once
        self._since = {pid: t for pid, t in self._since.items() if pid in seen}

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="d-state")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            self.check()
