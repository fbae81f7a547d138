"""What a serving candidate of a growing list of three or more has heard of the others
(see :mod:`agentd.store.candidacy`, "cut off"): it asks them every second, and keeps when
each last answered. From that, whether it is still in touch (:meth:`ContactLog.stale`),
whether the cut-off rule applies (:meth:`ContactLog.exposed`), and which candidates are
silent, so a client's search need not wait out their probe timeout
(:meth:`ContactLog.absent`; see :mod:`agentd.store.failover`).

The cut-off rule: a serving candidate that no other candidate answered (nor refused) for
:data:`CUT_OFF` seconds, where two or more had answered within :data:`PRESENT`, steps
down, and takes no promotion until one answers again. On the far side of a partition, two
candidates that reach each other promote one of theirs, and it would go on serving its own
agent over loopback beside them (S1, ``bench/simulate.py --failover`` seed 882). A request
that finds the last answer older than ``CUT_OFF`` waits for the next round of asks, so no
lease is renewed longer after the others' last sign (the fence of
:func:`agentd.rendezvous.forgotten.lifetime` adds that much). A list of two never applies
it (the other alone never promotes itself), nor a given list (its candidates may be stores
apart from the agents: one cut off from them may still serve its clients)."""

from __future__ import annotations

import time
from collections.abc import Iterable

CUT_OFF = 3.0
"""How long a serving candidate of a growing list of three or more serves with no other
candidate answering: then it steps down (see :mod:`agentd.store.candidacy`). A candidate
silent this long, while others answer, counts as absent."""
PRESENT = 30.0
"""A candidate silent this long, while this one heard others, counts as gone: its host was
lost, not ours cut off (a growing list never drops one), so its silence no longer counts."""


class ContactLog:
    """When the other candidates answered (or refused) the asks of this one, as it serves."""

    def __init__(self) -> None:
        self.last = 0.0
        """When the last round of asks that another candidate answered (or refused) began."""
        self.answered: dict[str, float] = {}
        """When each other candidate last answered (or refused) a round of asks."""
        self._since = 0.0
        """When this candidate began serving: the others' silence counts from then."""

    def begin(self) -> None:
        """Serving begins: the promoting client found another candidate, which is contact."""
        self.last = self._since = time.monotonic()

    def heard(self, began: float, endpoint: str) -> None:
        """The candidate at ``endpoint`` answered (or refused) an ask sent at ``began``."""
        self.last = max(self.last, began)
        self.answered[endpoint] = max(self.answered.get(endpoint, began), began)

    def admitted(self, endpoint: str) -> None:
        """The candidate at ``endpoint`` joined the list: its request just came."""
        self.last = self.answered[endpoint] = time.monotonic()

    def stale(self) -> bool:
        """No other candidate has answered for :data:`CUT_OFF`."""
        return time.monotonic() - self.last > CUT_OFF

    def exposed(self, others: Iterable[str]) -> bool:
        """Two or more of ``others`` answered within :data:`PRESENT`: two that reach each
        other could promote one of theirs (one alone never promotes itself)."""
        since = time.monotonic() - PRESENT
        return sum(self.answered.get(e, -1.0) >= since for e in others) >= 2

    def absent(self, others: Iterable[str]) -> list[str]:
        """Those of ``others`` that answered no ask begun in the last :data:`CUT_OFF` while
        another did (none while we hear nobody: the silence may be ours)."""
        if self.stale():
            return []
        since = time.monotonic() - CUT_OFF
        return [e for e in others if max(self.answered.get(e, 0.0), self._since) < since]
