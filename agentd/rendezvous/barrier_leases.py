"""The exit barrier's look at the leases of the members still at work.

A member in its exit barrier watches no heartbeat (:mod:`agentd.rendezvous.round_watch`
stops with its workers). Where every member but one waits there, nobody saw that one's
lease lapse: its host lost (its guardian with it, which would have marked it gone), its
agent frozen or cut off past its lease. Its ``done`` key never comes, and the others waited
out the whole barrier timeout (300 s by default) before closing the run as succeeded all
the same.

So each member in its barrier looks, every few seconds, at the leases of its
:data:`~agentd.rendezvous.round_watch.WATCHED` nearest successors by group rank that
answer for themselves: a successor whose heartbeat is gone and that was counted gone
already (it finished, left, or was found lapsed) is skipped for the next one, so a run of
lost members is covered from the first live member before it, as in the round watch. A
successor whose heartbeat has been missing for :data:`~agentd.rendezvous.accounting.FENCE`
and that carries no mark is counted gone, as lapsed (:func:`accounting.mark_lapsed`, as
the first member back at a next round counts it: only where the store holds no heartbeat
of it in the same step). The barrier's count of the round then shows that nobody is left
to finish it (:mod:`agentd.rendezvous.exit_barrier`).

A store restarted (or failed over) empty holds neither the round's entries nor its
members' leases. There the look goes on with the successors read as the barrier began
(or by the round watch as the round started:
:attr:`~agentd.rendezvous.round_watch.RoundWatch.ranks`), with a heartbeat TTL for a
fence (:meth:`SuccessorLeases.store_forgot_round`): a live member finds its heartbeat
forgotten at its next renewal and announces it again as it joins the next round, while a
lost one never does (seed 7989 of ``bench/simulate.py --kinds ...,restart_store``: a
member's host lost, the other's workers done, then the store restarted empty; the
barrier waited its timeout).

Each look costs one read of O(1) keys (the successors' entries once, then their
heartbeats and marks), whatever the job's size, unless many successors in a row were lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from agentd.rendezvous import accounting
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.round_watch import WATCHED
from agentd.store.api import Store


class SuccessorLeases:
    """The leases of the successors of group rank ``rank`` in round ``generation`` (of
    ``size`` members), looked at by :meth:`look`; ``known``: the round watch's successors
    (rank by node id)."""

    fence: float = accounting.FENCE
    """How long a successor's heartbeat must be missing before it is counted gone."""
    round_forgotten = False
    """The store forgot the round (:meth:`store_forgot_round`)."""
    forgot_at: float | None = None
    """When this member learned that (monotonic seconds)."""

    def __init__(
        self,
        store: Store,
        keys: RunKeys,
        generation: int,
        size: int,
        rank: int,
        known: Mapping[str, int] | None = None,
    ):
        self._store, self._keys = store, keys
        self._round = accounting.Carried(generation, size, member=True)
        self._order = [(rank + step) % size for step in range(1, size)]
        self._nodes: dict[int, str] = {place: node for node, place in (known or {}).items()}
        self._missing_since: dict[str, float] = {}

    async def learn(self) -> None:
        """Read the nearest successors' ids while the store holds the round (nothing
        where it does not)."""
        await self._named(self._order[:WATCHED])

    def store_forgot_round(self, ttl: float, now: float) -> None:
        """The store forgot the round (learned at ``now``): a live member's heartbeat may
        be missing from it until its next renewal, so one is counted gone only after
        ``ttl`` missing."""
        self.fence, self.round_forgotten, self.forgot_at = ttl, True, now
        self._missing_since.clear()

    def unseen_are_lost(self, now: float) -> bool:
        """The store forgot the round a fence (a heartbeat TTL) ago or more: a member
        alive and in reach has been back since (its renewal found its heartbeat forgotten,
        and it joined the next round), so one that has not is lost, or cut off past its
        lease, and at work no more, whether this member knows its id or not (seed 60963 of
        ``bench/simulate.py --failover``: a member killed as the round began and the
        store's host cut off, while another came back to a next round and left it; that
        one's arrival kept the barrier from the leases, whose first member counts the
        lapsed, and it could not in a store that forgot them)."""
        return self.forgot_at is not None and now - self.forgot_at >= self.fence

    async def look(self, now: float) -> tuple[int, bool]:
        """Look once (``now``: monotonic seconds): how many successors were newly counted
        gone, and whether one was seen missing that its fence does not let us count yet
        (look again within :attr:`fence` seconds)."""
        answering: list[tuple[str, bytes | None]] = []  # (node, heartbeat)
        keys, generation = self._keys, self._round.generation
        for start in range(0, len(self._order), WATCHED):
            batch = await self._named(self._order[start : start + WATCHED])
            if batch is None:  # the store lost the round: the barrier's other ends apply
                break
            read = await self._store.multi_get(
                [keys.heartbeat(node) for node in batch]
                + [keys.round(generation, f"{accounting.MEMBERS}/{node}") for node in batch]
            )
            beats, marks = read[: len(batch)], read[len(batch) :]
            answering += [  # one counted gone with its heartbeat gone: the next answers for it
                (node, beat)
                for node, beat, mark in zip(batch, beats, marks, strict=True)
                if beat is not None or mark is None
            ]
            if len(answering) >= WATCHED:
                break
        since = self._missing_since
        for node, beat in answering[:WATCHED]:
            if beat is not None:
                since.pop(node, None)
        unmarked = [node for node, beat in answering[:WATCHED] if beat is None]
        if not unmarked:
            return 0, False
        if self.forgot_at is not None:  # the new store never held their heartbeats
            for node in unmarked:
                since.setdefault(node, self.forgot_at)
        marked = await accounting.mark_lapsed(
            self._store, keys, self._round, unmarked, since, now, fence=self.fence
        )
        fencing = any(now - since[node] < self.fence for node in unmarked if node in since)
        return marked, fencing

    async def _named(self, ranks: list[int]) -> list[str] | None:
        """The node ids at ``ranks`` (read once each); None where the store lost them."""
        unknown = [rank for rank in ranks if rank not in self._nodes]
        if unknown:
            generation = self._round.generation
            entries = await self._store.multi_get(
                [self._keys.round(generation, f"node/{rank}") for rank in unknown]
            )
            if any(entry is None for entry in entries):
                return None
            for rank, entry in zip(unknown, entries, strict=True):
                self._nodes[rank] = str(json.loads(entry or b"{}")["node"])
        return [self._nodes[rank] for rank in ranks]
