"""The ``Store`` protocol: what rendezvous needs from a key-value store, any backend.

Keys are strings, values are bytes (nothing is ever pickled). Every change bumps a store
wide revision; :meth:`Store.watch` blocks until a key under a prefix changes after a
revision, so nothing waits by polling. Keys may carry a TTL (heartbeats): they vanish,
as a change, when not refreshed in time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from agentd.exceptions import AgentdError, StartError


class StoreError(AgentdError):
    """The store refused a request (the message says why)."""


class StoreUnavailable(StoreError, StartError):
    """The store could not be reached, even after retries."""


class StoreOutcomeUnknown(StoreUnavailable):
    """A request that must not be resent (``add``) failed after it may have been applied
    (``add_once`` is resent instead)."""


class StoreLeft(StoreUnavailable):
    """No candidate of the store answers an agent that leaves: the agents that could serve
    it have left as well (a job stopped whole), so nobody is left to tell."""


class StoreNotServing(StoreError):
    """A candidate store server stands by: another one serves (see store/candidates.py)."""


class StoreRefused(StoreError):
    """The store refused a request in a way no retry can fix (the message says why)."""

    exit_code = 3


class StoreAuthError(StoreRefused):
    """The store refused our credentials: a token, a password, a certificate."""


class StoreFull(StoreError):
    """The store refused a write that would take it past its size limit."""


class StoreTimeout(StoreError, TimeoutError):
    """A wait or watch ran out of time before its condition held."""


class KeyEvent(NamedTuple):
    """One change: ``value`` None means the key was deleted (or its TTL ran out)."""

    key: str
    value: bytes | None
    revision: int


class WatchResult(NamedTuple):
    """What a watch saw: the changes after the asked revision, and the store's revision.

    ``compacted`` says the asked revision is older than the history the store keeps; the
    caller must re-read the keys it cares about and watch from ``revision``.
    """

    revision: int
    events: tuple[KeyEvent, ...] = ()
    compacted: bool = False


class Store(Protocol):
    """An async key-value store with revisions, TTLs and watches."""

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        """Set ``key``; returns the new revision. ``ttl`` seconds make it expire."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        ...

    async def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the integer at ``key`` (0 if missing); returns the new value."""
        ...

    async def add_once(
        self, counter: str, marker: str, mark: bytes, absent: Sequence[str] = ()
    ) -> tuple[bool, int]:
        """Create ``marker`` holding ``mark`` and add 1 to the integer at ``counter`` (0 if
        missing), in one step, unless ``marker`` exists already or a key of ``absent`` does.

        Returns whether ``marker`` holds ``mark`` now (this call, or an earlier one with the
        same ``mark``, counted it) and the integer at ``counter``. Unlike :meth:`add`, it
        is safe to resend when an answer was lost: a mark is counted once however often it
        is sent (a member counted gone as a connection closes under it).
        """
        ...

    async def compare_set(
        self,
        key: str,
        expected: bytes | None,
        desired: bytes,
        ttl: float | None = None,
        present: Sequence[str] = (),
        absent: Sequence[str] = (),
    ) -> tuple[bool, bytes | None]:
        """Set ``key`` to ``desired`` only if it holds ``expected`` (None: is missing),
        every key of ``present`` exists and no key of ``absent`` does, in one step (a
        round's seal names its members' heartbeats: a store that does not hold their
        leases, restarted empty, refuses it; a lapsed lease's gone mark names the
        heartbeat: a store where the node still beats, failed over to, refuses it).

        Returns whether it was set, and the value the key holds now.
        """
        ...

    async def refresh(self, key: str, ttl: float) -> bool:
        """Push ``key``'s expiry to ``ttl`` seconds from now, without a change (a heartbeat:
        watchers see a heartbeat key only appear and vanish). False if it does not exist."""
        ...

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Several values at once (None for each missing key)."""
        ...

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        """Set several keys in one step; returns the new revision."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` (not empty); how many there were."""
        ...

    async def num_keys(self) -> int:
        """How many keys the store holds."""
        ...

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        """Return once every key exists; :class:`StoreTimeout` after ``timeout`` seconds."""
        ...

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        """Changes to keys under ``prefix`` after ``after_revision``; waits up to ``timeout``
        seconds for the first one (an empty result then).

        ``compacted`` answers a revision older than the kept history, and one newer than the
        store's own: the store lost its state (it restarted), so the caller must re-read.
        """
        ...

    async def revision(self) -> int:
        """The store's current revision."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
