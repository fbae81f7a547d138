"""MemoryStore: the Store protocol in one process (what the embedded server serves).

Every change bumps the revision and is kept in a history for watches, bounded by count
and by bytes (an old value is let go once no watcher can ask for it); a watch from a
revision older than that history reports ``compacted``, as etcd does. The live keys and
values are bounded too: a write past ``max_bytes`` is refused with :class:`StoreFull`.
TTL keys expire on one loop timer set for the earliest expiry, measured on the
:class:`ServingClock`: time the store was frozen (SIGSTOP) or starved does not count, so
on resume it reads the heartbeats queued meanwhile before it expires anyone. Waiters
sleep on an event that every change replaces (a change wakes exactly those asleep).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import heapq
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from agentd.store.api import KeyEvent, StoreError, StoreFull, StoreTimeout, WatchResult
from agentd.store.serving_clock import TICK, ServingClock
from agentd.store.watch_index import PrefixIndex, Wakeups

DEFAULT_HISTORY = 1 << 17
"""Events the watch history keeps (one that falls further behind reads the keys again,
"compacted"): a round that re-forms makes about 5 changes per node while its members
watch, so 16,384 nodes need no extra reads (4,096 overran 16,384 events: 1.7 s more)."""
DEFAULT_HISTORY_BYTES = 32 << 20
"""Bytes of keys and values the watch history keeps (about 250 per change)."""
DEFAULT_MAX_BYTES = 64 << 20
"""Bytes of live keys and values; rendezvous needs a few KiB per node."""
_EVENT_OVERHEAD = 64
"""What one event or item costs beyond its key and value, roughly (so empty values count)."""
EXPIRY_ROUNDING = 1e-6
"""Seconds early a TTL key may expire: far below any TTL, far above a float's rounding."""
log = logging.getLogger(__name__)


def _size(key: str, value: bytes | None) -> int:
    return len(key) + (len(value) if value is not None else 0) + _EVENT_OVERHEAD


class _Item:
    """A key's value, the revision that set it, and when it expires (None: never)."""

    __slots__ = ("expires_at", "revision", "value")

    def __init__(self, value: bytes, revision: int, expires_at: float | None) -> None:
        self.value = value
        self.revision = revision
        self.expires_at = expires_at


class MemoryStore:
    """An in-memory :class:`~agentd.store.api.Store`; all methods run on the event loop."""

    def __init__(
        self,
        history: int = DEFAULT_HISTORY,
        clock: Callable[[], float] | None = None,
        *,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        stall_guard: bool = True,
        on_lapse: Callable[[str], None] | None = None,
    ) -> None:
        clock = clock or time.monotonic  # read now: the protocol simulation's clock replaces it
        self._on_lapse = on_lapse
        """Told why, when a TTL key expires or the store stood still: signs that a client
        was cut off from it, or it from them (see :mod:`agentd.store.candidacy`)."""
        self._clock: Callable[[], float] = (
            ServingClock(clock, on_stall=self._stalled) if stall_guard else clock
        )
        """``stall_guard`` False: plain time and no tick, for a store only its own process
        uses (``--standalone``): there is nobody for whom to survive its freezes."""
        self._stall_guard = stall_guard
        self._tick: asyncio.TimerHandle | None = None
        self._items: dict[str, _Item] = {}
        self._revision = 0
        self._history: collections.deque[KeyEvent] = collections.deque()
        self._history_limit = (history, history_bytes)
        self._history_bytes = 0
        self._max_bytes = max_bytes
        self.bytes = 0
        """What the live keys and values take (see :data:`_EVENT_OVERHEAD`)."""
        self._wakeups = Wakeups()
        self._by_prefix = PrefixIndex()
        self._expiries: list[tuple[float, str]] = []
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._armed_for = 0.0
        """The expiry time (on the store's clock) the timer is armed for."""
        self.longest_ttl = 0.0
        """The longest TTL a write or refresh granted since the store last held no TTL key
        (:mod:`agentd.store.amnesia`: how long a lease it granted may outlive it)."""
        self.on_first_ttl_key: Callable[[], None] | None = None
        """Called as a TTL key is written while none was held, before the write answers
        (the store's lease record is written then, not a tick later)."""

    # -- reads and writes --------------------------------------------------------------------

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return self._put(key, value, ttl)

    async def get(self, key: str) -> bytes | None:
        item = self._live(key)
        return item.value if item else None

    async def add(self, key: str, delta: int) -> int:
        total = self._integer("add", key) + delta
        self._put(key, str(total).encode(), None)
        return total

    async def add_once(
        self, counter: str, marker: str, mark: bytes, absent: Sequence[str] = ()
    ) -> tuple[bool, int]:
        held = self._live(marker)
        total = self._integer("add_once", counter)
        if held is not None or any(self._live(k) is not None for k in absent):
            return held is not None and held.value == mark, total
        await self.multi_set({marker: mark, counter: str(total + 1).encode()})
        return True, total + 1

    async def compare_set(
        self,
        key: str,
        expected: bytes | None,
        desired: bytes,
        ttl: float | None = None,
        present: Sequence[str] = (),
        absent: Sequence[str] = (),
    ) -> tuple[bool, bytes | None]:
        item = self._live(key)
        current = item.value if item else None
        if (
            current != expected
            or any(self._live(k) is None for k in present)
            or any(self._live(k) is not None for k in absent)
        ):
            return False, current
        self._put(key, desired, ttl)
        return True, desired

    async def refresh(self, key: str, ttl: float) -> bool:
        item = self._live(key)
        if item is None:
            return False
        item.expires_at = self._clock() + ttl
        self.longest_ttl = max(self.longest_ttl, ttl)
        heapq.heappush(self._expiries, (item.expires_at, key))
        self._schedule_expiry()
        return True

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        grown = sum(
            _size(key, value) - (_size(key, old.value) if (old := self._items.get(key)) else 0)
            for key, value in items.items()
        )
        if grown > 0 and self.bytes + grown > self._max_bytes:  # all or nothing
            raise StoreFull(
                f"store is full: {len(items)} keys would take it past "
                f"{self._max_bytes} bytes ({self.bytes} used)"
            )
        for key, value in items.items():
            self._put(key, value, ttl)
        return self._revision

    async def delete(self, key: str) -> bool:
        if self._live(key) is None:
            return False
        self._remove(key)
        return True

    async def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise StoreError("delete_prefix: the prefix must not be empty")
        doomed = [key for key in self._items if key.startswith(prefix)]
        for key in doomed:
            self._remove(key)
        return len(doomed)

    async def num_keys(self) -> int:
        self._expire_due()
        return len(self._items)

    async def revision(self) -> int:
        return self._revision

    def snapshot(self) -> list[tuple[str, bytes, float | None]]:
        """Every live key, its value and its seconds left (None: no TTL), in the order
        written: what :meth:`restore` writes (a store handed to its successor)."""
        self._expire_due()
        now, held = self._clock(), sorted(self._items.items(), key=lambda p: p[1].revision)
        return [(k, i.value, None if i.expires_at is None else i.expires_at - now) for k, i in held]

    def restore(self, items: Sequence[tuple[str, bytes, float | None]]) -> None:
        for key, value, ttl in items:
            self._put(key, value, ttl)

    @property
    def holds_ttl_keys(self) -> bool:
        """Whether a TTL key may be live (one expired but not yet dropped counts)."""
        return bool(self._expiries)

    @property
    def waiting(self) -> int:
        """How many waits and watches are pending (long polls of clients still there)."""
        return len(self._wakeups)

    # -- waiting -----------------------------------------------------------------------------

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not all(self._live(key) for key in keys):
                    with self._wakeups.waiting(keys) as changed:
                        await changed.wait()
        except TimeoutError:
            missing = [key for key in keys if self._live(key) is None]
            raise StoreTimeout(f"wait: keys {missing} still missing after {timeout}s") from None

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while True:
                    result = self.changes_since(prefix, after_revision)
                    if result.events or result.compacted:
                        return result
                    with self._wakeups.waiting([prefix]) as changed:
                        await changed.wait()
        return WatchResult(self._revision)

    def changes_since(self, prefix: str, after_revision: int) -> WatchResult:
        """The changes under ``prefix`` after ``after_revision`` that the history still has."""
        self._expire_due()
        oldest = self._history[0].revision if self._history else self._revision + 1
        if after_revision < oldest - 1 and after_revision < self._revision:
            return WatchResult(self._revision, compacted=True)
        if after_revision > self._revision:  # a revision we never had: we restarted
            return WatchResult(self._revision, compacted=True)
        events = self._by_prefix.events(prefix, self._history)
        newer = events[bisect.bisect_right(events, after_revision, key=_revision_of) :]
        return WatchResult(self._revision, tuple(newer))

    async def close(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    # -- internals ---------------------------------------------------------------------------

    def _integer(self, op: str, key: str) -> int:
        """The integer at ``key`` (0 if missing), for ``op``."""
        item = self._live(key)
        try:
            return int(item.value) if item else 0
        except ValueError:
            raise StoreError(f"{op}: key {key!r} does not hold an integer") from None

    def _live(self, key: str) -> _Item | None:
        item = self._items.get(key)
        if item is not None and item.expires_at is not None and item.expires_at <= self._clock():
            self._expire(key)
            return None
        return item

    def _put(self, key: str, value: bytes, ttl: float | None) -> int:
        old = self._items.get(key)
        grown = _size(key, value) - (_size(key, old.value) if old is not None else 0)
        if grown > 0 and self.bytes + grown > self._max_bytes:
            raise StoreFull(
                f"store is full: {key!r} would take it past {self._max_bytes} bytes "
                f"of keys and values ({self.bytes} used)"
            )
        self.bytes += grown
        expires_at = None if ttl is None else self._clock() + ttl
        self._revision += 1
        self._items[key] = _Item(value, self._revision, expires_at)
        self._record(KeyEvent(key, value, self._revision))
        if expires_at is not None:
            self.longest_ttl = max(self.longest_ttl, ttl or 0.0)
            first = not self._expiries
            heapq.heappush(self._expiries, (expires_at, key))
            if first and self.on_first_ttl_key is not None:
                self.on_first_ttl_key()
            self._schedule_expiry()
        return self._revision

    def _remove(self, key: str) -> None:
        item = self._items.pop(key)
        self.bytes -= _size(key, item.value)
        self._revision += 1
        self._record(KeyEvent(key, None, self._revision))

    def _record(self, event: KeyEvent) -> None:
        history = self._history
        history.append(event)
        self._history_bytes += _size(event.key, event.value)
        count, size = self._history_limit
        while len(history) > 1 and (len(history) > count or self._history_bytes > size):
            gone = history.popleft()  # watchers from before it now read "compacted"
            self._history_bytes -= _size(gone.key, gone.value)
        self._by_prefix.record(event, history[0].revision)
        self._wakeups.changed(event.key)

    def _expire_due(self) -> None:
        # a microsecond early: the timer's loop time and the serving clock are sums of
        # different floats, and a key due a rounding error later would re-arm the timer
        # at the same instant, over and over (found by the protocol simulation)
        now = self._clock() + EXPIRY_ROUNDING
        while self._expiries and self._expiries[0][0] <= now:
            _, key = heapq.heappop(self._expiries)
            item = self._items.get(key)
            if item is not None and item.expires_at is not None and item.expires_at <= now:
                self._expire(key)

    def _expire(self, key: str) -> None:
        self._remove(key)
        if self._on_lapse is not None:
            self._on_lapse(f"{key!r} expired")

    def _schedule_expiry(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on a loop: expiry happens lazily, on the next read
        while self._expiries:  # drop heap entries of keys since rewritten or deleted
            at, key = self._expiries[0]
            item = self._items.get(key)
            if item is not None and item.expires_at == at:
                break
            heapq.heappop(self._expiries)
        timer = self._expiry_timer
        if timer is not None and self._expiries and self._armed_for <= self._expiries[0][0]:
            return  # it fires no later than the first expiry, and arms the next then
        if timer is not None:  # (a heartbeat's renewal moves no timer: one set, no timers)
            timer.cancel()
            self._expiry_timer = None
        if not self._expiries:
            self.longest_ttl = 0.0
        else:
            at = self._armed_for = self._expiries[0][0]
            self._expiry_timer = loop.call_at(
                loop.time() + max(0.0, at - self._clock()), self._on_expiry_timer
            )
            if self._tick is None and self._stall_guard:
                self._tick = loop.call_later(TICK, self._on_tick)

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        self._expire_due()
        self._schedule_expiry()

    def _stalled(self, seconds: float) -> None:
        if self._expiries:  # only then is the clock read every tick: a long gap is a stall
            if self._on_lapse is not None:
                self._on_lapse(f"the store stood still for {seconds:.1f}s")
            log.warning(
                "Store: stood still for %.1fs (frozen or starved); heartbeats do not "
                "expire for that time",
                seconds,
            )

    def _on_tick(self) -> None:
        """Keep the serving clock read while TTL keys exist (see :class:`ServingClock`)."""
        self._tick = None
        self._clock()
        if self._expiries:
            self._tick = asyncio.get_running_loop().call_later(TICK, self._on_tick)


def _revision_of(event: KeyEvent) -> int:
    return event.revision
