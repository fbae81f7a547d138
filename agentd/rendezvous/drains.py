"""A drain's agreement through the store: the request, every node's step, the chosen step,
every node's acknowledgement.

Keys, under ``agentd/<run_id>/drain/``::

    request             JSON {"id", "node", "reason", "at"}: the drain every agent follows
    <id>/leaving/<node> that node leaves once the drain is done (why): the requester, and
                        every node asked to drain while the request stood
    <id>/told/<node>    that node's workers are told of the drain (each pauses at its next
                        step): the seconds within which that node reports its step
    <id>/step/<node>    the furthest step that node's workers reported when they learned of it
    <id>/at_step        the step every rank checkpoints at: one past the furthest reported
                        (-1: none, as no worker reported a step)
    <id>/ack/<node>     JSON {"ranks", "steps"}: that node's workers saved their checkpoints

The draining agent writes ``request`` and ``at_step``; every agent (the draining one too)
watches the prefix, reports its step and acknowledges. One watch wakes every agent, so a
request reaches every node within one store round trip.

One drain at a time: a node asked to drain while another's request stands (a scheduler's
warning reaches every node of the job at once) joins that drain instead of replacing it,
and leaves with the requester once every node's checkpoint is saved. A request whose
agent died before it withdrew it is replaced: one older than the caller's
``stale_after``, or one by a node no longer in the round.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

from agentd.rendezvous.keys import RunKeys
from agentd.store.api import WatchResult

POLL = 5.0
"""Seconds a watch waits before looking again (a change wakes it at once)."""
TRIES = 3
"""Compare-and-sets a request makes before it writes over what stands (a request withdrawn
and another made at each try)."""


class DrainStore(Protocol):
    """What the protocol needs of a store: any :class:`~agentd.store.api.Store`, or node
    0's TCPStore in a static job (:mod:`~agentd.rendezvous.static_drains`)."""

    async def set(self, key: str, value: bytes) -> int: ...

    async def get(self, key: str) -> bytes | None: ...

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def delete(self, key: str) -> bool: ...

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]: ...

    async def wait(self, keys: Sequence[str], timeout: float) -> None: ...

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult: ...

    async def revision(self) -> int: ...


class DrainRequest(NamedTuple):
    id: int
    node: str
    reason: str
    at: float


class Drains:
    """One agent's side of the drain protocol in ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: Callable[[], DrainStore],
        keys: RunKeys,
        node_id: str,
        member_ids: Callable[[], Awaitable[list[str]]],
    ) -> None:
        self._store = store
        self._prefix = keys.prefix + "drain/"
        self.node_id = node_id
        self._member_ids = member_ids

    def _key(self, drain_id: int, name: str) -> str:
        return f"{self._prefix}{drain_id}/{name}"

    async def members(self) -> list[str]:
        """The node ids of the current round (read from the store, only when a drain
        stands or starts)."""
        return await self._member_ids()

    async def request(self, reason: str, stale_after: float) -> tuple[DrainRequest, bool]:
        """Start a drain of this node (its id is new), or join the one under way (see
        :meth:`live`): the drain this node leaves with, and whether it joined it (see the
        module docstring)."""
        mine = DrainRequest(
            int.from_bytes(os.urandom(7), "big") or 1, self.node_id, reason, time.time()
        )
        doc = {"id": mine.id, "node": mine.node, "reason": reason, "at": mine.at}
        store, key = self._store(), self._prefix + "request"
        request, joined, expected = mine, False, None
        for _ in range(TRIES):
            done, held = await store.compare_set(key, expected, json.dumps(doc).encode())
            if done:
                break
            standing = _parse(held) if held else None
            if standing is not None and await self.live(standing, stale_after):
                request, joined = standing, True
                break
            expected = held  # none now (withdrawn meanwhile), or stale: replace it
        else:
            await store.set(key, json.dumps(doc).encode())
        await store.set(self._key(request.id, f"leaving/{self.node_id}"), reason.encode() or b"?")
        return request, joined

    async def live(self, request: DrainRequest, stale_after: float) -> bool:
        """Whether a standing request is a drain under way: made less than ``stale_after``
        seconds ago, by a member of the current round (one whose agent died during its
        drain is out of the round once the others re-formed)."""
        fresh = time.time() - request.at < stale_after
        return fresh and request.node in await self.members()

    async def leaving(self, drain_id: int) -> set[str]:
        """The members that leave once drain ``drain_id`` is done."""
        members = await self.members()
        values = await self._store().multi_get(
            [self._key(drain_id, f"leaving/{node}") for node in members]
        )
        return {node for node, value in zip(members, values, strict=True) if value}

    async def chosen_step(self, drain_id: int, within: float) -> int | None:
        """(A node that joined the drain) The step its requester chose, waiting up to
        ``within`` seconds (None: none was chosen, as no worker reports steps, or none
        in time)."""
        key = self._key(drain_id, "at_step")
        with contextlib.suppress(TimeoutError):
            await self._store().wait([key], within)
        return _chosen(await self._store().get(key))

    async def current(self) -> tuple[DrainRequest | None, int | None]:
        """The drain requested (None) and its chosen step (None: not chosen yet)."""
        store = self._store()
        raw = await store.get(self._prefix + "request")
        if raw is None:
            return None, None
        request = _parse(raw)
        return request, _chosen(await store.get(self._key(request.id, "at_step")))

    async def changes(self, revision: int) -> int:
        """Wait for a change under the prefix after ``revision``; returns the new one."""
        result = await self._store().watch(self._prefix, revision, POLL)
        return result.revision

    async def revision(self) -> int:
        return await self._store().revision()

    async def report_step(self, drain_id: int, step: int) -> None:
        await self._store().set(self._key(drain_id, f"step/{self.node_id}"), str(step).encode())

    async def told(self, drain_id: int, within: float) -> None:
        """Our workers are told of drain ``drain_id``: each pauses at its next step until
        the step is chosen; we report their step within ``within`` seconds."""
        value = f"{within:.3f}".encode()
        await self._store().set(self._key(drain_id, f"told/{self.node_id}"), value)

    async def choose_step(
        self, drain_id: int, *, told_within: float, grace: float, settle: float
    ) -> tuple[int | None, list[str]]:
        """(The draining agent) Choose and publish one step past the furthest reported;
        with the members that had not told their workers of the drain ``told_within``
        seconds on. The choice waits until every member told its workers, and then until
        every member reported, or ``settle`` seconds after the first step reported (in a
        synchronous job a rank blocked in a collective cannot report, and cannot be ahead
        either), or until the longest a member said its report may take is over (``grace``
        seconds past it). None when no worker of any node reported a step: nobody counts
        steps, so no checkpoint can be coordinated (-1 is published, so the nodes that
        joined the drain know at once).

        Why every member is waited for: a worker told of the drain pauses at its next
        step until the step is chosen, so it cannot pass the step before it knows it.
        Choosing on the first reports alone let a member that saw the request late tell
        its workers the step after they had passed it (on a loaded machine one node's
        ranks checkpointed four steps after the others')."""
        store = self._store()
        nodes = await self.members()
        keys = [
            self._key(drain_id, f"{kind}/{node}") for kind in ("told", "step") for node in nodes
        ]
        began = time.monotonic()
        first: float | None = None
        every_told_at: float | None = None
        revision = await store.revision()
        while True:
            values = await store.multi_get(keys)
            told, steps = values[: len(nodes)], values[len(nodes) :]
            now = time.monotonic()
            if first is None and any(_step(v) >= 0 for v in steps):
                first = now
            every_told = all(
                t is not None or v is not None for t, v in zip(told, steps, strict=True)
            )
            if not every_told:
                until = began + told_within
            elif all(v is not None for v in steps):
                break
            elif first is not None:
                until = first + settle
            else:
                every_told_at = every_told_at or now
                until = every_told_at + max(_seconds(t) for t in told) + grace
            if now >= until:
                break
            revision = (await store.watch(self._key(drain_id, ""), revision, until - now)).revision
        missing = [
            node for node, t, v in zip(nodes, told, steps, strict=True) if t is None and v is None
        ]
        reported = [s for s in map(_step, steps) if s >= 0]
        chosen = max(reported) + 1 if reported else -1
        await self._store().set(self._key(drain_id, "at_step"), str(chosen).encode())
        return (chosen if chosen >= 0 else None), missing

    async def finish(self) -> None:
        """(The draining agent) The drain is over: withdraw the request."""
        await self._store().delete(self._prefix + "request")

    async def acknowledge(self, drain_id: int, doc: dict[str, Any]) -> None:
        await self._store().set(
            self._key(drain_id, f"ack/{self.node_id}"), json.dumps(doc).encode()
        )

    async def acknowledgements(self, drain_id: int, within: float) -> dict[str, Any]:
        """(The draining agent) Every member's acknowledgement, waiting up to ``within``
        seconds; those missing then are missing from the result."""
        members = await self.members()
        keys = [self._key(drain_id, f"ack/{node}") for node in members]
        with contextlib.suppress(TimeoutError):
            await self._store().wait(keys, within)
        values = await self._store().multi_get(keys)
        return {node: json.loads(v) for node, v in zip(members, values, strict=True) if v}


def _step(raw: bytes | None) -> int:
    """A member's reported step (-1: none, or not yet)."""
    return int(raw) if raw is not None else -1


def _chosen(raw: bytes | None) -> int | None:
    """The step a drain's ``at_step`` names (None: not chosen yet, or none: -1)."""
    step = _step(raw)
    return step if step >= 0 else None


def _seconds(raw: bytes | None) -> float:
    """The seconds a member said its report may take (0: it did not say)."""
    try:
        return float(raw) if raw is not None else 0.0
    except ValueError:
        return 0.0


def _parse(raw: bytes) -> DrainRequest:
    doc = json.loads(raw)
    return DrainRequest(int(doc["id"]), str(doc["node"]), str(doc["reason"]), float(doc["at"]))
