"""The node checks as one of the agent's services: the gate before each join, the watch
while the workers run, and what ``/status`` and ``/metrics`` show of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from agentd.nodecheck.gate import NodeGate
from agentd.rendezvous.api import PublishesExclusions, RendezvousHandler
from agentd.view import Helpers


class NodeCheckService:
    """Gates ``handler``'s joins with ``gate``; ``leave(why)`` asks the agent to leave the
    job when a check fails while the workers run."""

    def __init__(
        self,
        gate: NodeGate,
        handler: RendezvousHandler,
        leave: Callable[[str], None],
        notify: Callable[..., None],
        helpers: Helpers,
    ) -> None:
        self.gate = gate
        gate.notify = notify
        for check in gate.checks:  # their processes are the agent's, not orphans to reap
            check.helpers = helpers
        self._handler = handler
        self._leave = leave
        self._watch: asyncio.Task[None] | None = None

    async def admit(self) -> None:
        """Return when this host may join (its checks pass); excluded until then."""
        handler = self._handler
        publish = handler.publish_exclusion if isinstance(handler, PublishesExclusions) else None
        await self.gate.admit(publish)

    def workers_started(self) -> None:
        if self.gate.settings.interval > 0 and self._watch is None:
            self._watch = asyncio.create_task(self._watch_workers(), name="node-checks")

    async def workers_stopping(self) -> None:
        task, self._watch = self._watch, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch_workers(self) -> None:
        failed = await self.gate.watch()
        self._watch = None
        handler = self._handler
        if isinstance(handler, PublishesExclusions):  # why, before the others re-form
            await self.gate.announce(failed, handler.publish_exclusion)
        self._leave(
            "failed its node checks (" + "; ".join(f"{r.name}: {r.detail}" for r in failed) + ")"
        )

    def status(self) -> dict[str, Any]:
        doc = self.gate.status()
        handler = self._handler
        peers = handler.exclusions.peers if isinstance(handler, PublishesExclusions) else {}
        doc["excluded_peers"] = dict(peers)
        return doc
