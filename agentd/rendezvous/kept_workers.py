"""The in-process restarts' side of a rendezvous (:class:`~agentd.rendezvous.api.KeepsWorkers`):
the workers each node keeps into the rounds it joins, and whether this node sat a round
out, whose ranks trained on without its kept workers. A mixin of
:class:`~agentd.rendezvous.dynamic.DynamicRendezvous`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.rendezvous.rounds import Rounds


class KeptWorkers:
    """What a node keeps, for a rendezvous whose join records are ``_node``."""

    _node: dict[str, Any]
    _kept: list[int]
    _rounds: Rounds | None

    def announce_kept(self, local_ranks: Sequence[int]) -> None:
        """Our join records carry the local ranks we keep (none: no key at all)."""
        self._kept = sorted(local_ranks)
        self._node.pop("kept", None)
        self._node.update({"kept": self._kept} if self._kept else {})

    def sat_out(self) -> bool:
        """Whether a round was sealed without this node since its agent last asked: it
        waited beside one sealed full (a spare), arrived after one's seal, or came back
        after its lease lapsed to a round later than the one after its last
        (:meth:`~agentd.rendezvous.seal_wait.SealWait.missed_rounds`). That round's ranks
        may have trained on, and the state this node's kept workers hold is then older
        than the job's."""
        rounds = self._rounds
        if rounds is None:
            return False
        sat_out, rounds.sat_out = rounds.sat_out, False
        return sat_out
