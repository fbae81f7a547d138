"""AgentObserver: the hooks an agent calls as things happen (metrics and events use them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.group import WorkerFailure, WorkerState

if TYPE_CHECKING:
    from agentd.heartbeats.stragglers import Straggler

PHASES = ("detect", "stop", "rendezvous", "start")
"""The phases of a recovery, in order: see a failure, stop the group, rendezvous, start."""


class AgentObserver:
    """Subclass and override what you need; every hook here does nothing.

    Hooks run on the agent's event loop and must not block; an exception in one is logged
    and does not disturb the agent.
    """

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        """The worker group moved from ``old`` to ``new``."""

    def phase_timed(self, phase: str, seconds: float) -> None:
        """One of :data:`PHASES` took ``seconds``."""

    def restarted(self, reason: str, restart_count: int) -> None:
        """The group is being restarted (``failure``, ``unhealthy`` or ``membership``)."""

    def worker_failed(self, failure: WorkerFailure) -> None:
        """A worker failed (once per failure, root cause first)."""

    def hang_detected(self, details: dict[str, Any]) -> None:
        """The workers stopped heartbeating; ``details`` name who stopped first, where each
        rank was and where the stack dumps are (as in ``result.json``'s ``hang``)."""

    def straggler(self, straggler: Straggler) -> None:
        """A rank has been slower than the others' median for a while (reported once)."""

    def node_excluded(self, details: dict[str, Any]) -> None:
        """This host failed its node checks and stays out of the job for a cooldown
        (``details``: reason, checks, exclusions, cooldown, until)."""

    def node_readmitted(self) -> None:
        """This host's node checks pass again: it joins the job."""

    def drain_requested(self, details: dict[str, Any]) -> None:
        """A drain began (``details``: id, node, reason, requested_at): checkpointing."""

    def drain_done(self, outcome: dict[str, Any]) -> None:
        """This node's drain is over (``outcome``: step, nodes, acknowledged, missing,
        seconds); it leaves the job."""
