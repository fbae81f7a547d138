"""The agent's recent restarts, for ``/status``: when, why (a failure, an unhealthy group,
a membership change) and, for a failure, who failed and how, so ``agentd status`` after a
restart says what happened, not only that the generation moved."""

from __future__ import annotations

import collections
import time
from typing import Any

from agentd.group import WorkerFailure
from agentd.view import AgentObserver

KEEP = 10
"""Restarts kept, the latest last."""


class RestartHistory(AgentObserver):
    """Told of each worker failure and restart; :meth:`document` lists the last :data:`KEEP`."""

    def __init__(self) -> None:
        self._restarts: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self._cause: str | None = None
        """The first failure since the last restart (the root cause: told first)."""

    def worker_failed(self, failure: WorkerFailure) -> None:
        if self._cause is None:
            self._cause = failure.summary().splitlines()[0]

    def restarted(self, reason: str, restart_count: int) -> None:
        cause, self._cause = self._cause, None
        self._restarts.append(
            {
                "at": time.time(),
                "reason": reason,
                "restart_count": restart_count,
                "cause": cause if reason != "membership" else None,
            }
        )

    def document(self) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self._restarts]
