"""What the job-wide straggler comparison does, and how often."""

from __future__ import annotations

from typing import NamedTuple

WINDOW_INTERVALS = 2
"""A node is named once its ratio stayed over the factor this many intervals."""
JOB_RATE = 8.0
"""The most store requests a second the comparison makes for the whole job: beyond
``JOB_RATE * interval`` nodes, each agent's interval stretches to ``nodes / JOB_RATE``
seconds (256 nodes: 32 s), which keeps the store's cost bounded at any size."""


class SlowNodeSettings(NamedTuple):
    interval: float = 5.0
    """Seconds between two store requests of one agent (0: no job-wide comparison)."""
    factor: float = 1.5
    """A node is slow at this many times the other nodes' median compute time."""
    replace: bool = False
    """Drain a slow node when a spare waits, so the spare takes its place."""

    def paced(self, nodes: int) -> float:
        """Each agent's interval in a job of ``nodes`` nodes."""
        return max(self.interval, nodes / JOB_RATE)

    def window(self, nodes: int) -> float:
        """How long a node stays over the factor before it is named."""
        return WINDOW_INTERVALS * self.paced(nodes)
