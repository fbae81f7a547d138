"""FailoverStore: the Store protocol over a list of candidate servers, one serving at a time.

It finds the candidate serving (see :mod:`agentd.store.candidates`) on its first request
and keeps talking to it; while nothing fails, that is the only extra cost (one probe of
each candidate at start). When the server stops answering, or answers that it stands
by, the client asks every candidate its role, moves to the one serving under the newest
term or promotes the lowest-index candidate that answers, and sends the request again
there (except an ``add`` that may have been applied). The new server's state is empty,
which the caller sees as a store that restarted: the next watch answers ``compacted``
and the rendezvous re-forms its round there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentd.store.api import (
    StoreNotServing,
    StoreOutcomeUnknown,
    StoreUnavailable,
    WatchResult,
)
from agentd.store.candidates import Prober, RoleReport
from agentd.store.http_client import HttpStore
from agentd.store.retry import Backoff
from agentd.store.wire import CANDIDATES_HEADER, TERM_HEADER

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_RETRY = 1.0
"""Seconds one server's connection failures are retried before the others are asked."""
STARTUP_GRACE = 5.0
"""At the first request, how long lower-index candidates that do not answer yet are waited
for before a higher one is promoted (agents and stores start in any order)."""


class FailoverStore:
    """A client of the candidates at ``endpoints`` (host:port, in their order).

    ``retry_timeout``: how long to look for a serving candidate before a request fails
    with :class:`StoreUnavailable`, naming every candidate and why it did not serve.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        token: str,
        *,
        retry_timeout: float = 30.0,
        request_timeout: float = 10.0,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self._prober = Prober(self.endpoints, token)
        self._client = HttpStore(self.endpoints[0], token, retry_timeout=SERVER_RETRY,
                                 request_timeout=request_timeout)  # fmt: skip
        self._retry_timeout = retry_timeout
        self.term = 0
        """The newest term seen: requests carry it, so a replaced server learns it was."""
        self.serving: int | None = None
        """The index of the candidate this client talks to (None: not found yet)."""
        self.failed: dict[str, str] = {}
        """Candidates seen failing, and why (the last time), until seen serving again."""
        self.failovers = 0
        self._moves = 0
        self._lock = asyncio.Lock()
        self._started = time.monotonic()
        self._set_headers()

    @property
    def observer(self) -> Callable[[str, float], None] | None:
        return self._client.observer

    @observer.setter
    def observer(self, value: Callable[[str, float], None] | None) -> None:
        self._client.observer = value

    @property
    def requests(self) -> int:
        """Store requests sent, retries included (probes are not counted)."""
        return self._client.requests

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows: the candidates, which one serves, which ones failed."""
        serving = None if self.serving is None else self.endpoints[self.serving]
        return {"endpoints": list(self.endpoints), "serving": serving, "term": self.term,
                "failovers": self.failovers, "failed": dict(self.failed)}  # fmt: skip

    # -- finding the server ------------------------------------------------------------------

    async def _call(self, request: Callable[[HttpStore], Awaitable[T]]) -> T:
        while True:
            moves = self._moves
            if self.serving is None:
                await self._find_server(moves, "")
                continue
            try:
                result = await request(self._client)
            except StoreOutcomeUnknown as exc:  # never resent; the next request moves on
                if self.serving is not None:
                    self.failed[self.endpoints[self.serving]] = str(exc)
                raise
            except (StoreUnavailable, StoreNotServing) as exc:
                await self._find_server(moves, str(exc))
                continue
            self._adopt(self._client.server_term)
            return result

    async def _find_server(self, moves: int, why: str) -> None:
        """Move to the candidate serving now (promoting one if none does), unless another
        request moved since this one failed (``moves``)."""
        async with self._lock:
            if self._moves != moves:
                return
            old = self.serving
            if old is not None:
                self.failed[self.endpoints[old]] = why
            backoff = Backoff(self._retry_timeout, initial=0.1, maximum=1.0)
            while True:
                reports = await self._prober.roles(self.term)
                self._adopt(max(report.term for report in reports))
                found = await self._serving_or_promoted(reports)
                if found is not None:
                    self._move(old, found, why)
                    return
                if not await backoff.pause():
                    raise StoreUnavailable(self._none_serving(reports))

    async def _serving_or_promoted(self, reports: list[RoleReport]) -> RoleReport | None:
        serving = [r for r in reports if r.serving and r.term >= self.term]
        if serving:
            return max(serving, key=lambda r: (r.term, -r.index))
        for report in reports:
            if not report.reachable:
                self.failed[report.endpoint] = report.problem
        reachable = [r for r in reports if r.reachable]
        if not reachable:
            return None
        first = reachable[0]
        early = self.serving is None and self.failovers == 0 and not self._moves
        if early and first.index > 0 and time.monotonic() - self._started < STARTUP_GRACE:
            return None  # the lower ones may just not have started yet
        promoted = await self._prober.ask(first.index, "promote", {"term": self.term + 1},
                                          self.term)  # fmt: skip
        self._adopt(promoted.term)
        return promoted if promoted.serving else None

    def _move(self, old: int | None, found: RoleReport, why: str) -> None:
        self.failed.pop(found.endpoint, None)
        if found.index == old:  # it serves still (a slow answer, not a lost server); had it
            return  # lost its state meanwhile, its new instance would tell the client so
        self.serving = found.index
        self._moves += 1
        self._client.move_to(found.endpoint, lost_state=old is not None)
        if old is None and self.failovers == 0 and self._moves == 1:
            log.info("Store: candidate %d of %d, %s, serves (term %d)", found.index,
                     len(self.endpoints), found.endpoint, found.term)  # fmt: skip
            return
        self.failovers += 1
        gone = self.endpoints[old] if old is not None else "the store"
        log.warning("Store failover: %s stopped serving (%s); now using %s (candidate %d, "
                    "term %d); its state starts empty, so the round re-forms there", gone,
                    why or "no answer", found.endpoint, found.index, found.term)  # fmt: skip

    def _none_serving(self, reports: list[RoleReport]) -> str:
        states = "; ".join(f"{r.endpoint}: {r.problem or r.role}" for r in reports)
        return (f"no store candidate serves, after {self._retry_timeout:g}s of trying "
                f"({states})")  # fmt: skip

    def _adopt(self, term: int) -> None:
        if term > self.term:
            self.term = term
            self._set_headers()

    def _set_headers(self) -> None:
        headers = self._prober.headers(self.term)
        self._client.extra_headers = {key: headers[key] for key in (TERM_HEADER,
                                                                    CANDIDATES_HEADER)}  # fmt: skip

    # -- the Store protocol ------------------------------------------------------------------

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self._call(lambda s: s.set(key, value, ttl))

    async def get(self, key: str) -> bytes | None:
        return await self._call(lambda s: s.get(key))

    async def add(self, key: str, delta: int) -> int:
        return await self._call(lambda s: s.add(key, delta))

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, ttl: float | None = None
    ) -> tuple[bool, bytes | None]:
        return await self._call(lambda s: s.compare_set(key, expected, desired, ttl))

    async def refresh(self, key: str, ttl: float) -> bool:
        return await self._call(lambda s: s.refresh(key, ttl))

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._call(lambda s: s.multi_get(keys))

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        return await self._call(lambda s: s.multi_set(items, ttl))

    async def delete(self, key: str) -> bool:
        return await self._call(lambda s: s.delete(key))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._call(lambda s: s.delete_prefix(prefix))

    async def num_keys(self) -> int:
        return await self._call(lambda s: s.num_keys())

    async def revision(self) -> int:
        return await self._call(lambda s: s.revision())

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        await self._call(lambda s: s.wait(keys, timeout))

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        return await self._call(lambda s: s.watch(prefix, after_revision, timeout))

    async def close(self) -> None:
        await self._client.close()
        await self._prober.close()
