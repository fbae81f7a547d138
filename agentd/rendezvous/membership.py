"""Membership: this agent's heartbeat in the store, and the lease it proves.

An agent is a member of a round only while the store holds its heartbeat, a TTL key the
store deletes when it is not refreshed for ``ttl`` seconds of the store's serving time.
The agent cannot see that deletion as it happens, so it keeps a lease of its own that
never outlasts the store's:

    lease = (the send time of the last heartbeat the store confirmed) + ttl

The store received that heartbeat after it was sent, so it expires the key no earlier
than the lease ends. :meth:`Membership.lost` returns a little before the lease ends
(``margin``) unless a newer heartbeat was confirmed, so the agent can stop its workers
before anyone could be given their ranks; a heartbeat the store reports expired (or a
store that forgot it) ends membership at once. The lease is kept for stores in another
process only: one inside the agent is never out of reach.

One exception keeps a *frozen* store from costing every agent a restart. On a store that
serves from one process (the embedded one, not etcd), a heartbeat still waiting for its
answer after :data:`~agentd.store.sockets.DELIVERED_AFTER` seconds, on a connection that
has not failed, reached the store's host (TCP would have given up on bytes it could not
deliver). Such a store is not serving anyone (it reads every connection as it runs), so
it cannot expire us either (its TTLs run on serving time): the lease is extended in short
steps while that holds, and ends the moment the connection fails (a partition, a dead
store), and only when every heartbeat since the last confirmed one reached the store: after
a failed one (a partition of ours) the others may have failed over meanwhile, and a held
heartbeat proves nothing of that. The extension is bounded: never past one TTL after the
held heartbeat was sent,
the lease that heartbeat would have given had it been answered at once. A store that
serves others while it holds ours (a failover under way, a handler stuck on our
connection) may expire us on that clock, so no proof lets a lease run longer. When the
held heartbeat is answered, the lease counts from its send time, as always. So a store
frozen for less than the TTL minus the margin costs no restart, as long as the TTL leaves
room to see the proof (``ttl - margin - interval`` at least ``DELIVERED_AFTER``: 15 s, 1 s
and 5 s by default); a longer freeze cannot be told from a lost store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from agentd.store.api import Store, StoreError
from agentd.store.sockets import DELIVERED_AFTER
from agentd.support.aio import cancel_and_wait
from agentd.support.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

LeaseListener = Callable[["float | None"], None]
"""Told the lease's end (monotonic seconds) whenever it moves; None: no lease now."""

_EXTEND_STEP = 1.0
"""While a frozen store holds our heartbeat, the lease is extended this much at a time."""


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the running loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


class Membership:
    """The heartbeat of one agent (``key`` in ``store``) and its lease.

    ``lease`` False: the store is in this process (no lease, never lost by silence).
    ``single_process``: the store serves from one process, so a delivered, unanswered
    heartbeat proves it is frozen (see the module docstring).
    """

    def __init__(
        self,
        store: Store,
        key: str,
        value: bytes,
        ttl: float,
        interval: float,
        *,
        lease: bool,
        single_process: bool,
        where: str,
    ) -> None:
        self._store = store
        self._key = key
        self._value = value
        self.ttl = ttl
        self._interval = interval
        self._leased = lease
        self._extendable = lease and single_process
        self._where = where
        self.margin = min(1.0, ttl / 4)
        """How long before the lease ends :meth:`lost` returns, to stop the workers in."""
        self.member = False
        """In a round now: an expired heartbeat then means membership is lost."""
        self.told_expired = False
        """Membership was lost because the store answered that our heartbeat had expired
        (it expired us, or forgot us: restarted or failed over), not by silence."""
        self.dropped = False
        """Since the last :meth:`announce`, the store said our heartbeat had expired while
        we were in no round, and it was made again: a round sealed meanwhile may have
        gone on without us."""
        self._announced_at = -math.inf
        """When the latest :meth:`announce` was answered (monotonic seconds): a heartbeat
        sent before, or while one is under way, may have read the key before the write."""
        self._announcing = 0
        self._confirmed_until: float | None = None
        self._deadline: float | None = None
        self._pending_since: float | None = None
        self._lost: str | None = None
        self._changed = asyncio.Event()
        self._listeners: list[LeaseListener] = []
        self._task: asyncio.Task[None] | None = None
        self._problems = RateLimitedLog(log, interval=max(10.0, ttl))
        self._failing_since: float | None = None

    # -- the lease -------------------------------------------------------------------------

    @property
    def answered(self) -> bool:
        """The store has confirmed a heartbeat of ours at least once: it has been reached."""
        return self._confirmed_until is not None

    @property
    def deadline(self) -> float | None:
        """When the lease ends (monotonic seconds); None without a lease."""
        return self._deadline if self._leased else None

    def on_lease(self, listener: LeaseListener) -> None:
        self._listeners.append(listener)
        listener(self.deadline)

    def expired(self) -> str:
        """Why membership is over already ('' while it holds)."""
        if self._lost:
            return self._lost
        return self._silence_reason() if self.lapsed() else ""

    def lapsed(self) -> bool:
        """The lease has run out by the clock (beyond what a heartbeat held by a frozen
        store extends): the store may have expired us, and no round joined before now may
        start workers on it."""
        deadline = self.deadline
        now = time.monotonic()
        if deadline is None or now < deadline:
            return False
        return not self._delivered() or now >= self._extension_limit()

    def rejoined(self) -> None:
        """A new round begins: forget why the last membership ended."""
        self._lost = None
        self.told_expired = False

    async def lost(self) -> str:
        """Return, saying why, once membership is lost: the store reported our heartbeat
        expired, or no heartbeat was confirmed until ``margin`` before the lease ends."""
        while True:
            if self._lost:
                return self._lost
            deadline = self.deadline
            now = time.monotonic()
            if deadline is None:
                wake_at = None
            elif now < deadline - self.margin:
                wake_at = deadline - self.margin
            elif self._delivered() and now < self._extension_limit() - self.margin:
                self._extend(now)
                wake_at = now + _EXTEND_STEP / 2
            else:
                self._lose(self._silence_reason())
                continue
            self._changed.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that comes as
            # the event is set (a heartbeat confirmed as the round watch is cancelled), and
            # the task then waited on, uncancelled, holding up whoever cancelled it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(None if wake_at is None else _loop_time(wake_at)):
                    await self._changed.wait()

    def _delivered(self) -> bool:
        """A heartbeat reached the frozen store's host and waits there, unanswered, and
        every heartbeat since the last one confirmed reached it too. After a failed one
        (a partition of ours, say), a held heartbeat proves nothing of what the others
        did meanwhile: they may have failed over and fenced the round we held on a
        clock that ends before this heartbeat's TTL would (seed 39 of
        ``tests/sim/test_failover.py``: a worker went on beside its rank's successor)."""
        pending = self._pending_since
        return (
            self._extendable
            and pending is not None
            and self._failing_since is None
            and time.monotonic() - pending >= DELIVERED_AFTER
        )

    def _extension_limit(self) -> float:
        """The furthest a held heartbeat may extend the lease: one TTL after its send."""
        return (self._pending_since or 0.0) + self.ttl

    def _extend(self, now: float) -> None:
        if self._deadline is None or self._deadline < now + _EXTEND_STEP:
            self._problems.warning(
                "frozen",
                "Rendezvous: the store at %s has held our "
                "heartbeat for %.0fs without answering (frozen?); it "
                "cannot expire us meanwhile, so the workers go on",
                self._where,
                now - (self._pending_since or now),
            )
            self._set_deadline(min(now + _EXTEND_STEP, self._extension_limit()))

    def _silence_reason(self) -> str:
        since = self._failing_since
        last_sent = (self._confirmed_until or self.ttl) - self.ttl
        what = (
            f"no heartbeat sent in the last {time.monotonic() - last_sent:.1f}s was "
            f"confirmed by the store at {self._where}"
        )
        if since is not None:
            what += f" (unreachable since {time.monotonic() - since:.1f}s ago)"
        elif self._pending_since is not None:
            held = time.monotonic() - self._pending_since
            what += f" (it has held the latest for {held:.1f}s without answering)"
        return what + f", within the heartbeat TTL of {self.ttl:g}s"

    def _lose(self, reason: str) -> None:
        if not self._lost:
            self._lost = reason
            self._changed.set()

    def _confirm(self, sent: float) -> None:
        until = sent + self.ttl
        if self._confirmed_until is None or until > self._confirmed_until:
            self._confirmed_until = until
        if self._failing_since is not None:
            log.info("Rendezvous: the store at %s answers again", self._where)
            self._failing_since = None
        self._set_deadline(max(until, self._deadline or until))

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        self._changed.set()
        for listener in self._listeners:
            try:
                listener(self.deadline)
            except Exception:
                log.exception("Lease listener %r failed", listener)

    # -- the heartbeat ---------------------------------------------------------------------

    async def announce(self) -> int:
        """(Re)create our heartbeat, as on every join (a restarted store forgot it); returns
        the store's revision after it. The lease counts from the send, so one answered
        more than a heartbeat interval after it (retried while the store was out of reach)
        is sent once more: its lease could end before the round it joins is sealed."""
        self._announcing += 1
        try:
            for _ in range(2):
                sent = time.monotonic()
                revision = await self._store.set(self._key, self._value, ttl=self.ttl)
                if time.monotonic() - sent <= self._interval:
                    break
        finally:
            self._announcing -= 1
            self._announced_at = time.monotonic()
        self._deadline = None  # a new lease: the old one may have been extended
        self.dropped = False
        self._confirm(sent)
        return revision

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._beat(), name="rdzv-heartbeat")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _beat(self) -> None:
        beat: Callable[[str, float], Awaitable[bool]] = getattr(
            self._store, "heartbeat", self._store.refresh
        )
        sent = time.monotonic()
        while True:
            # due an interval after the last one was sent: one answered late (held by a
            # frozen store) is followed at once, before the lease it renewed runs out
            await asyncio.sleep(max(0.0, sent + self._interval - time.monotonic()))
            sent = self._pending_since = time.monotonic()
            try:
                if self._extendable:  # a frozen store may hold it: wait for the answer
                    alive = await beat(self._key, self.ttl)
                else:  # etcd answers or fails in time; never let an attempt pile up
                    async with asyncio.timeout(max(self._interval, self.ttl / 2)):
                        alive = await beat(self._key, self.ttl)
            except (StoreError, TimeoutError) as exc:
                self._failed(exc)
                continue
            finally:
                self._pending_since = None
            if alive:
                self._confirm(sent)
            elif sent < self._announced_at or self._announcing:
                continue  # read before the latest join's write was answered: made since
            elif self.member:
                self.told_expired = True
                self._lose(
                    f"the store at {self._where} says our heartbeat had expired (or it "
                    "forgot it: restarted?)"
                )
            else:  # not in a round: nobody counts on it, so just make it again
                with contextlib.suppress(StoreError):
                    await self.announce()
                self.dropped = True

    def _failed(self, exc: BaseException) -> None:
        """A heartbeat failed: said at INFO while the failures are younger than an
        interval (a failover to the next store candidate, or a blip, is over by then), at
        WARNING once they go on longer. Counting failures instead misled: a heartbeat
        held until its connection was reset is retried at once, and in a CI run that
        retry was refused 11 ms before the failover it was part of ended."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        brief = now - self._failing_since < self._interval
        level = logging.INFO if brief else logging.WARNING
        problem = str(exc) or "no answer in time"
        if not self.member:  # no lease anyone counts on: the store is waited for
            self._problems(
                level,
                "no answer once" if brief else "no answer",
                "Rendezvous: the store at %s does not answer (%s); waiting for it "
                "(this agent is in no round now)",
                self._where,
                problem,
            )
            return
        left = (self.deadline or now) - now
        self._problems(
            level,
            "unreachable once" if brief else "unreachable",
            "Rendezvous: heartbeat to the store at %s failed "
            "(%s); membership lapses in %.1fs unless it answers",
            self._where,
            problem,
            max(0.0, left),
        )
