"""Hang detection's settings (``agentd run``'s heartbeat flags), light enough for the
command line and the agent to hold without loading the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STEP = ""
"""The key of the intervals between heartbeats outside any section."""
START = "\x00start"
"""The key of the times new workers took from their start to their first message, which
bound how long a rank resumed in process waits before its first heartbeat (no section
name holds a NUL)."""
DEFAULT_INITIAL_TIMEOUT = 600.0
LEARNED_FILE = "heartbeats.json"
"""Where a run's learned samples are kept, in its run directory (a new agent reads them)."""


@dataclass(frozen=True)
class HeartbeatSettings:
    """Hang detection settings (``agentd run`` flags of the same names).

    ``initial_timeout`` None means :data:`DEFAULT_INITIAL_TIMEOUT`, applied only once some
    worker of the group has heartbeated; given explicitly, it also holds a job that never
    heartbeats. ``step_timeout``, ``section_timeouts`` and ``resume_timeout`` (a rank
    resumed in process, until its first heartbeat: :data:`START`) override learning.
    """

    initial_timeout: float | None = None
    step_timeout: float | None = None
    section_timeouts: Mapping[str, float] = field(default_factory=dict)
    safety_factor: float = 2.0
    min_timeout: float = 2.0
    straggler_factor: float = 1.5
    straggler_steps: int = 20
    resume_timeout: float | None = None

    @property
    def initial(self) -> float:
        return self.initial_timeout if self.initial_timeout is not None else DEFAULT_INITIAL_TIMEOUT

    def explicit(self, key: str) -> float | None:
        if key == START:
            return self.resume_timeout
        return self.step_timeout if key == STEP else self.section_timeouts.get(key)
