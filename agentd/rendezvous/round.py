"""A round: the limits it fills within, and a member's view of one it is in."""

from __future__ import annotations

from typing import NamedTuple

from agentd.rendezvous.summary import RoundSummary


class RoundSettings(NamedTuple):
    """How long a round may wait to fill (``--nnodes`` and ``--rdzv-conf``)."""

    min_nodes: int
    max_nodes: int
    last_call_timeout: float
    join_timeout: float
    entry_timeout: float
    """How long the sealer waits for a member's entry after its arrival (its ``add``):
    an agent silent that long is gone, and the round is ended."""


class Round(NamedTuple):
    """A round this agent is a member of."""

    generation: int
    rank: int
    summary: RoundSummary
    revision: int
    """A store revision from before the round was sealed, and after this agent joined it:
    watch for the round's end after it."""
    mine: bytes
    """Our own node entry, as written: gone from the store means the store lost the round."""

    @property
    def size(self) -> int:
        return self.summary.size
