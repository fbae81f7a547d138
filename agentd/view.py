"""The agent's services: each one duty of LocalElasticAgent beside its worker lifecycle.

A service is started with the agent (in order) and stopped with it (in reverse, whatever
happened); it sees the agent through read-only views and small callbacks, never its
internals. The worker lifecycle (plan, spawn, watch, stop) stays in the agent's core.
"""

from __future__ import annotations

from typing import Protocol


class Service(Protocol):
    """Something the agent runs beside its workers, from start to shutdown."""

    async def start(self) -> None:
        """Start; raising StartError stops the agent before any worker runs."""
        ...

    async def stop(self) -> None:
        """Stop and release everything; never raises (it runs on every way out)."""
        ...
