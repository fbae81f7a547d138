"""Indexes that keep a :class:`~agentd.store.memory.MemoryStore`'s waiting and watching
proportional to what each waiter asks for, not to the store's traffic.

* :class:`Wakeups`: a write wakes only the waiters of its key's prefixes.
* :class:`PrefixIndex`: the history's events under each recently watched prefix, so a
  watch from an old revision finds its own events by bisection instead of scanning every
  change since. (With 4,096 nodes each watching one key from its own join on, the scan
  made the rendezvous quadratic: 139 million prefix tests in one round.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterable, Iterator, Sequence

from agentd.store.api import KeyEvent

PREFIXES = 64
"""Prefixes indexed at once; the least recently watched is dropped (it is rebuilt from
the history when watched again)."""
TRIM_EVERY = 1024
"""Changes between two trims of the indexed events the history has dropped."""


class Wakeups:
    """Who waits for a change to which keys: a write wakes only the waiters under whose
    prefix its key falls (one look per distinct prefix), never every waiter. With N nodes
    each waiting on one key, a round of N writes costs O(N) wake-ups, not O(N^2). Waiters
    wake in the order they began to wait (a dict, not a set: a set's order is its
    members' addresses, which differ from run to run)."""

    def __init__(self) -> None:
        self._by_prefix: dict[str, dict[asyncio.Event, None]] = {}

    @contextlib.contextmanager
    def waiting(self, prefixes: Sequence[str]) -> Iterator[asyncio.Event]:
        """An event set by the next change under any of ``prefixes`` (a key is its own
        prefix); it is forgotten when the block ends, however it ends."""
        event = asyncio.Event()
        for prefix in prefixes:
            self._by_prefix.setdefault(prefix, {})[event] = None
        try:
            yield event
        finally:
            for prefix in prefixes:
                waiters = self._by_prefix.get(prefix)
                if waiters is not None:
                    waiters.pop(event, None)
                    if not waiters:
                        del self._by_prefix[prefix]

    def __len__(self) -> int:
        return len(set().union(*self._by_prefix.values()))

    def changed(self, key: str) -> None:
        for prefix, waiters in self._by_prefix.items():
            if key.startswith(prefix):
                for event in waiters:
                    event.set()


class PrefixIndex:
    """Each indexed prefix's events, in revision order, from the oldest one the history
    holds (older ones are trimmed now and then: a reader skips them by revision)."""

    def __init__(self) -> None:
        self._events: collections.OrderedDict[str, list[KeyEvent]] = collections.OrderedDict()
        self._untrimmed = 0

    def events(self, prefix: str, history: Iterable[KeyEvent]) -> list[KeyEvent]:
        """The events under ``prefix`` (indexed from ``history`` on first use); the caller
        must not change the list."""
        found = self._events.get(prefix)
        if found is None:
            found = self._events[prefix] = [e for e in history if e.key.startswith(prefix)]
            if len(self._events) > PREFIXES:
                self._events.popitem(last=False)
        else:
            self._events.move_to_end(prefix)
        return found

    def record(self, event: KeyEvent, oldest: int) -> None:
        """``event`` happened; the history now starts at revision ``oldest``."""
        for prefix, events in self._events.items():
            if event.key.startswith(prefix):
                events.append(event)
        self._untrimmed += 1
        if self._untrimmed >= TRIM_EVERY:
            self._untrimmed = 0
            for events in self._events.values():
                gone = 0
                while gone < len(events) and events[gone].revision < oldest:
                    gone += 1
                del events[:gone]
