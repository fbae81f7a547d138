"""The gate a host passes before each rendezvous join, and the watch while its workers run.

:meth:`NodeGate.admit` runs every check (at once); while one fails the host is excluded: it
says why (log, event, metric, a key in the store the other agents read), waits a cooldown
that doubles with each exclusion (up to 16 times ``cooldown``), and checks again. The
``max_exclusions + 1``-th exclusion within :data:`WINDOW` seconds gives up
(:class:`NodeUnfit`, exit code 4). :meth:`NodeGate.watch` runs the checks every
``interval`` seconds while the workers run and returns the failures that make the host
leave the job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentd.exceptions import AgentdError
from agentd.nodecheck.checks import CheckResult, NodeCheck

log = logging.getLogger(__name__)

WINDOW = 3600.0
"""Exclusions older than this do not count towards ``max_exclusions``."""
MAX_COOLDOWN_FACTOR = 16


class NodeUnfit(AgentdError):
    """This host failed its checks too often: it gives up rather than flap."""

    exit_code = 4


@dataclass(frozen=True)
class NodeCheckSettings:
    interval: float = 30.0
    """Seconds between two checks while the workers run (0: only before joining)."""
    cooldown: float = 10.0
    """Seconds an excluded host waits before checking again, doubled each exclusion."""
    max_exclusions: int = 5
    """Exclusions within :data:`WINDOW` tolerated; one more gives up (0: never)."""


Publish = Callable[[dict[str, Any] | None], Awaitable[None]]
"""Puts this host's exclusion (None: its end) where the other agents see it."""


class NodeGate:
    """Runs ``checks`` as ``settings`` say."""

    def __init__(self, checks: Sequence[NodeCheck], settings: NodeCheckSettings) -> None:
        self.checks = tuple(checks)
        self.settings = settings
        self.notify: Callable[..., None] = lambda hook, *args: None
        """``notify(hook, *args)`` tells the agent's observers (the agent sets it)."""
        self._exclusions: deque[float] = deque()
        self.failures: Counter[str] = Counter()
        """Failed runs of each check, since the agent started (the metric's counts)."""
        self.last: list[CheckResult] = []
        self.excluded: dict[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.checks)

    async def run_checks(self) -> list[CheckResult]:
        """Run every check at once; returns the failed ones."""
        self.last = list(await asyncio.gather(*(check.run() for check in self.checks)))
        failed = [result for result in self.last if not result.ok]
        for result in failed:
            self.failures[result.name] += 1
        return failed

    async def admit(self, publish: Publish | None = None) -> None:
        """Return once every check passes; until then, excluded (see the module)."""
        if not self.checks:
            return
        while failed := await self.run_checks():
            cooldown = self.exclude(failed)
            if publish is not None:
                await self._publish(publish, self.excluded)
            await asyncio.sleep(cooldown)
        if self.excluded is not None:
            log.info("Node checks pass again; joining the job")
            self.notify("node_readmitted")
            self.excluded = None
            if publish is not None:
                await self._publish(publish, None)

    def exclude(self, failed: Sequence[CheckResult]) -> float:
        """Count one exclusion for ``failed``; returns the cooldown to wait.
        Raises :class:`NodeUnfit` past ``max_exclusions`` within the window."""
        now = time.monotonic()
        while self._exclusions and now - self._exclusions[0] > WINDOW:
            self._exclusions.popleft()
        self._exclusions.append(now)
        count = len(self._exclusions)
        why = "; ".join(f"{r.name}: {r.detail}" for r in failed)
        limit = self.settings.max_exclusions
        if limit and count > limit:
            raise NodeUnfit(
                f"node checks failed {count} times within {WINDOW / 60:g} min "
                f"(--node-check-max-exclusions {limit}); giving up: {why}"
            )
        cooldown = self._cooldown(count)
        self.excluded = self._doc(failed, count, cooldown)
        log.warning(
            "Node checks failed (%s); this node stays out of the job for %gs (exclusion %d)",
            why,
            cooldown,
            count,
        )
        self.notify("node_excluded", dict(self.excluded))
        return cooldown

    async def announce(self, failed: Sequence[CheckResult], publish: Publish) -> None:
        """The watch found ``failed``: publish why before this host leaves the job, so the
        round the others form without it names the reason. Before, only the check of the
        next :meth:`admit` published it, often after that round was sealed. Not counted:
        that check counts the exclusion, and publishes it again."""
        count = len(self._exclusions) + 1
        await self._publish(publish, self._doc(failed, count, self._cooldown(count)))

    def _cooldown(self, count: int) -> float:
        return self.settings.cooldown * min(2 ** (count - 1), MAX_COOLDOWN_FACTOR)

    @staticmethod
    def _doc(failed: Sequence[CheckResult], count: int, cooldown: float) -> dict[str, Any]:
        return {
            "reason": "; ".join(f"{r.name}: {r.detail}" for r in failed),
            "checks": [r.name for r in failed],
            "exclusions": count,
            "cooldown": cooldown,
            "until": time.time() + cooldown,
        }

    async def watch(self) -> list[CheckResult]:
        """While the workers run: check every ``interval`` seconds; returns the failures
        (never returns while the checks pass; cancel it when the workers stop)."""
        while True:
            await asyncio.sleep(self.settings.interval)
            failed = await self.run_checks()
            if failed:
                return failed

    def status(self) -> dict[str, Any]:
        return {
            "checks": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in self.last]
            or [{"name": c.name, "ok": None, "detail": "not run yet"} for c in self.checks],
            "excluded": self.excluded,
            "failures": dict(self.failures),
        }

    @staticmethod
    async def _publish(publish: Publish, doc: dict[str, Any] | None) -> None:
        try:
            async with asyncio.timeout(5.0):
                await publish(doc)
        except Exception as exc:  # the others then see only a smaller world; we go on
            log.warning(
                "Could not publish this node's exclusion in the store: %s",
                str(exc) or type(exc).__name__,
            )
