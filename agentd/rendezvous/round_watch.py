"""Watching a completed round for its end elsewhere: a new generation (a failure or a join
on another node), a member's heartbeat vanishing (scale-down), or the rendezvous closed
as failed. One watch on the run's ``ctl/`` keys, with a re-read at the start and
whenever the store may have lost events (compacted, restarted, out of reach).

Each member watches :data:`WATCHED` heartbeats: its successors' by group rank (wrapping
around). A member that dies is noticed by the members just before it, which end the
round for everyone; should they all be gone too, the ones before them notice that. So any
loss short of the whole round is seen, even while some members are not watching (their
workers finished: they wait in the exit barrier), and each member reads O(1) keys, not N.

A member whose workers had succeeded (its ``done`` key is set) is not lost when its
heartbeat goes: it left from its exit barrier (stopped, drained, killed), its work done,
and the round goes on for the workers still running. Ending the round there stopped the
others' workers in the middle of their work (rank 0 saving the final model), as torch's
agents do not."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentd.rendezvous.api import LOST_REASON
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.roll_call import answer
from agentd.rendezvous.round import Round
from agentd.rendezvous.rounds import POLL
from agentd.store.api import Store, StoreError, StoreUnavailable
from agentd.support.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

WATCHED = 3
"""Successors whose heartbeats each member watches."""
RETRY_PAUSE = 1.0
"""Pause between tries at a store that cannot be reached (each try retries for a while)."""


@dataclass
class RoundWatch:
    """Watches round ``current`` of run ``run_id``. A member found gone ends the round for
    everyone (``end_round``); a rendezvous closed as failed raises (``raise_if_failed``).
    Once a peer closed it as succeeded, members leave because they are done: the round
    goes on for the workers still running here, as under torch."""

    store: Store
    keys: RunKeys
    current: Round
    run_id: str
    end_round: Callable[[str], Awaitable[None]]
    raise_if_failed: Callable[[bytes], None]
    problems: RateLimitedLog
    succeeded_elsewhere: bool = False
    _addrs: dict[str, str] = field(default_factory=dict)
    """The watched members' addresses (``--local-addr``), by node id, for messages."""
    ranks: dict[str, int] = field(default_factory=dict)
    """The watched members' places in the round, by node id: read as the watch starts,
    they are what the exit barrier looks at once the store forgot the round
    (:mod:`~agentd.rendezvous.barrier_leases`)."""
    finished: set[str] = field(default_factory=set)
    """Watched members that left after their workers succeeded: watched no more."""

    async def reason(self) -> str:
        """Why the round ended elsewhere, once it has; store trouble is waited out (the
        membership lease decides when it is too much)."""
        store = self.store
        current = self.current
        members: dict[str, str] = {}
        """The watched heartbeat key -> its node id."""
        revision = current.revision  # events after it are seen by the watch below
        check = True
        while True:
            try:
                if check:  # at the start, and whenever the store may have lost events
                    why = await self._state(members)
                    if why:
                        return why
                    check = False
                result = await store.watch(self.keys.ctl, revision, POLL)
            except StoreUnavailable as exc:
                self.problems.warning(
                    "watch",
                    "Rendezvous %s: cannot watch the round (%s); retrying",
                    self.run_id,
                    exc,
                )
                await asyncio.sleep(RETRY_PAUSE)
                check = True
                revision = await self._revision(revision)
                continue
            if result.compacted:
                check = True
                revision = await self._revision()
                continue
            revision = result.revision
            for event in result.events:
                if event.key == self.keys.gen and _after(event.value, current.generation):
                    return f"generation {current.generation} ended"
                if event.key == self.keys.closed and event.value is not None:
                    self.raise_if_failed(event.value)
                    self.succeeded_elsewhere = True
                if event.key == self.keys.rollcall and event.value is not None:
                    await answer(store, self.keys, event.value, current)
                if event.key in members and event.value is None and not self.succeeded_elsewhere:
                    why = await self._lost(event.key, members)
                    if why:
                        return why

    async def _revision(self, otherwise: int = 0) -> int:
        """The store's revision now (``otherwise`` while it cannot be reached)."""
        try:
            return await self.store.revision()
        except StoreUnavailable:
            return otherwise

    async def _watched(self) -> dict[str, str]:
        """The successors' heartbeat keys -> their node ids (none in a round of one)."""
        current = self.current
        ranks = {(current.rank + step) % current.size for step in range(1, WATCHED + 1)}
        ranks.discard(current.rank)
        keys = [self.keys.round(current.generation, f"node/{rank}") for rank in sorted(ranks)]
        found = zip(sorted(ranks), await self.store.multi_get(keys), strict=True)
        # (gone: the store lost the round; the check says so)
        entries = [(rank, json.loads(e)) for rank, e in found if e is not None]
        self._addrs.update({str(e["node"]): str(e.get("addr") or "") for _, e in entries})
        self.ranks.update({str(e["node"]): rank for rank, e in entries})
        nodes = [str(e["node"]) for _, e in entries]
        return {self.keys.heartbeat(n): n for n in nodes if n not in self.finished}

    async def _state(self, members: dict[str, str]) -> str:
        """Why the round is over already ('' if it is not). Fills ``members`` with the
        watched heartbeat on the first call."""
        current = self.current
        generation = current.generation
        if not members:
            members.update(await self._watched())
        mine = self.keys.round(generation, f"node/{current.rank}")
        keys = [self.keys.gen, self.keys.closed, mine, *members]
        gen, closed, entry, *beats = await self.store.multi_get(keys)
        if closed is not None:
            self.raise_if_failed(closed)
            self.succeeded_elsewhere = True
        if gen != str(generation).encode() and (gen is not None or generation > 0):
            return f"generation {generation} ended"  # (round 0 runs before the key exists)
        if entry != current.mine:
            return _old_state(generation)
        for key, beat in zip(list(members), beats, strict=True):
            if beat is None and not self.succeeded_elsewhere:
                why = await self._lost(key, members)
                if why:
                    return why
        return ""

    async def store_lost_round(self) -> str:
        """Why the round is over, once the store answered our heartbeat 'expired': it no
        longer holds our entry (it restarted or failed over, forgetting the heartbeat with
        it), or '' (it expired us, or it cannot say within a second: it just answered, so
        a slow store is not a new one)."""
        current = self.current
        key = self.keys.round(current.generation, f"node/{current.rank}")
        try:
            async with asyncio.timeout(1.0):
                entry = await self.store.get(key)
        except (StoreError, TimeoutError):
            return ""
        return _old_state(current.generation) if entry != current.mine else ""

    def _done_key(self, rank: int) -> str:
        """The key a member at ``rank`` of our round sets once its workers succeeded."""
        return self.keys.round(self.current.generation, f"done/{rank}")

    async def _lost(self, key: str, members: dict[str, str]) -> str:
        """The heartbeat ``key`` of a watched member is gone: end the round for everyone
        (the first member back counts it gone once its workers are surely dead: see
        :data:`agentd.rendezvous.accounting.FENCE`); why. '' where the member's workers had
        succeeded: it is watched no more, and the round goes on."""
        node = members[key]
        rank = self.ranks.get(node)
        done = rank is not None and await self.store.get(self._done_key(rank)) is not None
        if done:
            del members[key]
            self.finished.add(node)
            log.info(
                "Rendezvous %s: node %s left after its workers succeeded; the round goes on",
                self.run_id,
                node,
            )
            return ""
        addr = self._addrs.get(node)
        why = f"node {addr} ({node}) {LOST_REASON}" if addr else f"node {node} {LOST_REASON}"
        await self.end_round(why)
        return why


def _after(value: bytes | None, generation: int) -> bool:
    """Whether a ``ctl/gen`` change to ``value`` ends round ``generation`` (a deleted one
    does: the store was wiped; a lower one is history replayed from before the round)."""
    return value is None or not value.isdigit() or int(value) > generation


def _old_state(generation: int) -> str:
    return f"round {generation} went with the store's old state (a restart or failover)"
