"""Watching a completed round for its end elsewhere: a new generation (a failure or a join
on another node), a member's heartbeat vanishing (scale-down), or the rendezvous closed
as failed. One watch on the run's ``ctl/`` keys, with a full re-read at the start and
whenever the store may have lost events (compacted, restarted, out of reach)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.rounds import POLL, Round
from agentd.store.api import Store, StoreUnavailable
from agentd.support.ratelog import RateLimitedLog

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

    async def reason(self) -> str:
        """Why the round ended elsewhere, once it has; store trouble is waited out (the
        membership lease decides when it is too much)."""
        store = self.store
        current = self.current
        members = {self.keys.heartbeat(str(node["node"])): str(node["node"])
                   for node in current.nodes}  # fmt: skip
        revision = current.revision
        check = True
        while True:
            try:
                if check:  # at the start, and whenever the store may have lost events
                    revision = await store.revision()
                    why = await self._state(members)
                    if why:
                        return why
                    check = False
                result = await store.watch(self.keys.ctl, revision, POLL)
            except StoreUnavailable as exc:
                self.problems.warning("watch", "Rendezvous %s: cannot watch the round (%s); "
                                      "retrying", self.run_id, exc)  # fmt: skip
                await asyncio.sleep(RETRY_PAUSE)
                check = True
                continue
            if result.compacted:
                check = True
                continue
            revision = result.revision
            for event in result.events:
                if event.key == self.keys.gen and event.value != str(current.generation).encode():
                    return f"generation {current.generation} ended"
                if event.key == self.keys.closed and event.value is not None:
                    self.raise_if_failed(event.value)
                    self.succeeded_elsewhere = True
                if event.key in members and event.value is None and not self.succeeded_elsewhere:
                    why = f"node {members[event.key]} left (no heartbeat)"
                    await self.end_round(why)
                    return why

    async def _state(self, members: Mapping[str, str]) -> str:
        """Why the round is over already ('' if it is not)."""
        current = self.current
        generation = current.generation
        mine = self.keys.round(generation, f"node/{current.rank}")
        keys = [self.keys.gen, self.keys.closed, mine, *members]
        gen, closed, entry, *beats = await self.store.multi_get(keys)
        if closed is not None:
            self.raise_if_failed(closed)
            self.succeeded_elsewhere = True
        if gen != str(generation).encode():
            return f"generation {generation} ended"
        if entry != current.mine:
            return f"the store lost round {generation} (it restarted?)"
        for key, beat in zip(members, beats, strict=True):
            if beat is None and not self.succeeded_elsewhere:
                why = f"node {members[key]} left (no heartbeat)"
                await self.end_round(why)
                return why
        return ""
