"""Watches on etcd: one ``/v3/watch`` stream per call, read until the first batch of
events under the prefix, a cancel, or the caller's deadline.

etcd serves a watch that starts behind its current revision ("unsynced") only on its next
sync, and a compacted start revision cancels the watch (``compacted`` for the caller). So a
watch created behind first reads what changed in between, and one that finds nothing of
ours re-watches from etcd's revision (at most a few times), which is live.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from agentd.store.aiohttp_failures import MAYBE_SENT, NOT_SENT
from agentd.store.api import KeyEvent, StoreError, StoreUnavailable, WatchResult
from agentd.store.etcd.codes import UNAVAILABLE, watch_cancel_code
from agentd.store.etcd.gateway import EtcdGateway, b64, is_tls, kv_value, prefix_end
from agentd.store.retry import Backoff


class _Resync(Exception):
    """Nothing under the watched prefix changed up to ``revision``: watch from there."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


class _Retry(Exception):
    """One attempt on the member ``endpoint`` failed in a way another attempt, maybe on
    another member, can fix."""

    def __init__(self, endpoint: str, problem: str, silent: bool = False) -> None:
        super().__init__(f"{endpoint}: {problem}")
        self.endpoint = endpoint
        self.silent = silent
        """The member gave no answer (see :meth:`EtcdGateway.fail_over`)."""


RESYNCS = 1
"""New watches from etcd's revision after a catch-up that found nothing: one wins the race
with a quiet store at once; a busy one moves on meanwhile (each of a 64-node rendezvous's
watches caught up 3 times), and the last watch then waits for etcd's sync (<= 100 ms)."""


class EtcdWatch:
    """Watches for one :class:`~agentd.store.etcd.store.EtcdStore`: keys under ``prefix``
    through ``gateway``; ``revision`` reads the store's current revision."""

    def __init__(
        self, gateway: EtcdGateway, prefix: str, revision: Callable[[], Awaitable[int]]
    ) -> None:
        self._gw = gateway
        self._prefix = prefix
        self._revision = revision

    def _unkey(self, raw: str) -> str:
        return base64.b64decode(raw).decode()[len(self._prefix) :]

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        """As the protocol says. On timeout the result's revision stays ``after_revision``:
        etcd may still be replaying history to a watch it has just created."""
        deadline = time.monotonic() + timeout
        backoff = Backoff(self._gw.retry_timeout)
        resyncs = 0
        while True:
            try:
                return await self._watch_once(prefix, after_revision, deadline, resyncs < RESYNCS)
            except _Resync as exc:  # nothing of ours changed up to exc.revision: watch from there
                after_revision, resyncs = exc.revision, resyncs + 1
                continue
            except _Retry as exc:
                problem = str(exc)
                self._gw.fail_over(exc.endpoint, problem, exc.silent)
            if time.monotonic() >= deadline:
                return WatchResult(after_revision)
            if not await backoff.pause():
                raise StoreUnavailable(self._gw.unavailable(problem))

    async def _watch_once(
        self, prefix: str, after_revision: int, deadline: float, resync: bool
    ) -> WatchResult:
        await self._gw.ensure_token()
        start = (self._prefix + prefix).encode()
        create = {
            "key": b64(start or b"\0"),
            "range_end": b64(prefix_end(start)),
            "start_revision": str(after_revision + 1),
        }
        endpoint = self._gw.endpoint
        self._gw.requests += 1
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                stream = self._stream(endpoint, create, start, after_revision, resync)
                return await self._unless_left(endpoint, stream)
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):  # connecting timed out
                raise _Retry(endpoint, repr(exc), silent=True) from exc
            return WatchResult(after_revision)
        except (*NOT_SENT, *MAYBE_SENT) as exc:
            if is_tls(exc):
                raise self._gw.tls_refused(endpoint, exc) from exc
            raise _Retry(endpoint, repr(exc), silent=True) from exc
        except aiohttp.ClientConnectionError as exc:
            self._gw.raise_if_closed(endpoint, "watch", exc)
            raise
        except ValueError as exc:
            raise StoreError(
                f"etcd at {endpoint}: /v3/watch did not answer JSON; is this an etcd v3 client URL?"
            ) from exc

    async def _stream(
        self,
        endpoint: str,
        create: dict[str, str],
        start: bytes,
        after_revision: int,
        resync: bool,
    ) -> WatchResult:
        """One watch stream on the member ``endpoint``, read as :meth:`_read_watch` says."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._gw.request_timeout)
        async with self._gw.session().post(
            endpoint + "/v3/watch",
            headers=self._gw.headers(),
            json={"create_request": create},
            timeout=timeout,
        ) as response:
            if response.status != 200:
                data = await response.json(content_type=None)
                code = self._gw.answer_code(endpoint, "/v3/watch", response.status, data)
                self._gw.raise_refusal(endpoint, "watch", code, str(data.get("message")))
                raise _Retry(endpoint, str(data.get("message")))
            self._gw.answering = True
            return await self._read_watch(endpoint, response, start, after_revision, resync)

    async def _unless_left(self, endpoint: str, stream: Awaitable[WatchResult]) -> WatchResult:
        """``stream``'s result, unless the client moves on from the member ``endpoint``
        first (other requests found it stalled): then the watch starts again where the
        client went. A watch on a stalled member otherwise saw nothing until its deadline
        (a minute), and its agent missed the rounds its peers formed meanwhile."""
        reading = asyncio.ensure_future(stream)
        reading.add_done_callback(_outcome_read)  # read, however this wait ends
        left = asyncio.ensure_future(self._gw.left(endpoint).wait())
        try:
            await asyncio.wait({reading, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            reading.cancel()  # nothing if it is done; else its response closes as it ends
        if reading.done() and not reading.cancelled():
            return reading.result()
        raise _Retry(endpoint, "the client moved on to another member")

    async def _read_watch(
        self,
        endpoint: str,
        response: aiohttp.ClientResponse,
        start: bytes,
        after_revision: int,
        resync: bool,
    ) -> WatchResult:
        """Read the stream until a batch of events, a cancel, or the caller's deadline.

        etcd serves a watch that starts in the past ("unsynced") only on its next sync, up
        to 100 ms later, and keeps doing so until it has caught up. So a watch created
        behind etcd's revision first reads what changed in between: changes are returned
        at once, and no changes mean ``_Resync``: a new watch from etcd's revision, which
        is live (with ``resync`` false, it waits for the sync instead)."""
        while True:
            line = await response.content.readline()
            if not line:
                raise _Retry(endpoint, "the watch stream ended", silent=True)
            message = json.loads(line)
            if "error" in message:  # the gateway's in-stream error: {"error": {"grpc_code": ...}}
                error = message["error"]
                code = int(error.get("grpc_code", UNAVAILABLE))
                self._gw.raise_refusal(endpoint, "watch", code, str(error.get("message")))
                raise _Retry(endpoint, str(error.get("message")))
            result = message.get("result", {})
            if result.get("canceled"):
                if "compact_revision" in result:
                    return WatchResult(await self._revision(), compacted=True)
                reason = str(result.get("cancel_reason", ""))
                if "Unauthenticated" in reason and self._gw.has_credentials:
                    self._gw.forget_token()
                    raise _Retry(endpoint, reason)
                self._gw.raise_refusal(endpoint, "watch", watch_cancel_code(reason), reason)
                raise _Retry(endpoint, f"watch cancelled: {reason}")
            if result.get("created"):
                current = int(result["header"].get("revision", 0))
                if current < after_revision:  # etcd lost the history we knew: it was wiped
                    return WatchResult(current, compacted=True)
                if current > after_revision:
                    caught_up = await self._changes_between(start, after_revision, current)
                    if caught_up is not None and caught_up.events:
                        return caught_up
                    if caught_up is not None and resync:
                        raise _Resync(current)
            events = result.get("events")
            if events:
                return self._events(events)

    async def _changes_between(self, start: bytes, old: int, new: int) -> WatchResult | None:
        """The keys under ``start`` that differ between revisions ``old`` and ``new``, as
        events at their state in ``new`` (None: ``old`` is compacted away). Several changes
        of one key in between come out as one (its latest state), a deletion at ``new``."""
        body: dict[str, Any] = {"key": b64(start or b"\0"), "range_end": b64(prefix_end(start))}
        ranges = [{"request_range": {**body, "revision": str(rev)}} for rev in (old, new)]
        try:  # both reads in one request: a transaction of two ranges in the past
            doc = await self._gw.post("watch_catch_up", "/v3/kv/txn", {"success": ranges})
        except StoreError:
            return None
        before, after = (r["response_range"] for r in doc["responses"])
        was = {kv["key"]: kv for kv in before.get("kvs", [])}
        events = []
        for kv in after.get("kvs", []):
            if was.pop(kv["key"], {}).get("mod_revision") != kv["mod_revision"]:
                value = kv_value(kv)
                events.append(KeyEvent(self._unkey(kv["key"]), value, int(kv["mod_revision"])))
        events += [KeyEvent(self._unkey(key), None, new) for key in was]
        return WatchResult(new, tuple(sorted(events, key=lambda e: e.revision)))

    def _events(self, raw: list[dict[str, Any]]) -> WatchResult:
        events = []
        for event in raw:
            kv = event["kv"]
            deleted = event.get("type") == "DELETE"  # PUT, the zero value, is left out
            value = None if deleted else kv_value(kv)
            events.append(KeyEvent(self._unkey(kv["key"]), value, int(kv["mod_revision"])))
        return WatchResult(max(e.revision for e in events), tuple(events))


def _outcome_read(task: asyncio.Future[WatchResult]) -> None:
    """Retrieve an abandoned watch's outcome (asyncio logs one never retrieved)."""
    if not task.cancelled():
        task.exception()


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the running loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


def common_prefix(keys: Sequence[str]) -> str:
    """The longest prefix every key shares (what one watch must cover)."""
    if not keys:
        return ""
    low, high = min(keys), max(keys)
    size = 0
    while size < min(len(low), len(high)) and low[size] == high[size]:
        size += 1
    return low[:size]
