"""EtcdStore: the Store protocol on etcd v3, through its JSON gateway (aiohttp, no gRPC).

The mapping:

* every key is stored as ``prefix + key`` (``key_prefix``); watches and counts stay inside;
* ``add`` and ``compare_set`` are transactions that compare the key's revision or value;
* a TTL is a lease (whole seconds, at least etcd's minimum) and ``refresh`` its keepalive,
  so watchers see a heartbeat key appear once and vanish when its lease expires;
* ``watch`` is one ``/v3/watch`` stream from ``after_revision + 1``, closed after the first
  batch of events; etcd cancelling it with a ``compact_revision`` is ``compacted``;
* ``wait`` reads the keys and their revision in one transaction, then watches from the
  next revision, so no change between the read and the watch is missed.

The gateway answers errors as a gRPC ``code`` in the body; :mod:`agentd.store.etcd_codes`
says which are the cluster's passing state (no leader, a request timed out inside etcd, too
many requests, ...). Those and connection failures move on to the next endpoint and retry
with backoff until ``retry_timeout``; a write that may have been applied is resent only when
resending cannot change its outcome (everything but ``add``). The rest, refusals of the
request itself, raise :class:`~agentd.store.api.StoreRefused` at once.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import math
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from agentd.store.api import (
    KeyEvent,
    StoreAuthError,
    StoreError,
    StoreOutcomeUnknown,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
    WatchResult,
)
from agentd.store.etcd_codes import UNAUTHENTICATED, Verdict, classify, watch_cancel_code
from agentd.store.retry import MAYBE_SENT, NOT_SENT, Backoff
from agentd.store.sockets import keepalive_socket

log = logging.getLogger(__name__)

DEFAULT_PORT = 2379
MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: longer multi-key requests are split."""

_TLS_FAILED = (aiohttp.ClientSSLError,)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty prefix (or all 0xff): every key


class _Resync(Exception):
    """Nothing under the watched prefix changed up to ``revision``: watch from there."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


class _Retry(Exception):
    """One attempt failed in a way another attempt, maybe on another member, can fix."""


class EtcdStore:
    """A :class:`~agentd.store.api.Store` on the etcd cluster at ``endpoints`` (base URLs,
    ``http://host:port`` or ``https://...``); requests fail over between them."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = "",
        ssl_context: ssl.SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        retry_timeout: float = 30.0,
        request_timeout: float = 10.0,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._prefix = prefix
        self._ssl = ssl_context
        self._credentials = (username, password or "") if username else None
        self._token: str | None = None
        self._retry_timeout = retry_timeout
        self._request_timeout = request_timeout
        self._current = 0
        self._answering = True
        """The member in use answered last time (so a failure is news worth a warning)."""
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0
        """Requests sent, retries included (for benchmarks and metrics)."""
        self.observer: Callable[[str, float], None] | None = None
        """Told (operation, seconds) after each answered request but watches (metrics)."""

    @property
    def where(self) -> str:
        """The endpoints, for messages."""
        return ",".join(self.endpoints)

    # -- requests ----------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True,
                                             socket_factory=keepalive_socket)  # fmt: skip
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    def _fail_over(self, problem: str) -> None:
        """Move to the next member; say so once when the one in use stops answering."""
        failed = self.endpoints[self._current]
        self._current = (self._current + 1) % len(self.endpoints)
        if self._answering and len(self.endpoints) > 1:
            log.warning("etcd member %s failed (%s); trying %s", failed, problem,
                        self.endpoints[self._current])  # fmt: skip
        self._answering = False

    async def _post(self, op: str, path: str, body: dict[str, Any], *, idempotent: bool = True,
                    token: bool = True) -> dict[str, Any]:  # fmt: skip
        """POST ``body`` to ``path`` on the current member, failing over and retrying.

        ``token``: the request needs our auth token (all but authenticating itself)."""
        if token and self._credentials and self._token is None:
            await self._authenticate()
        backoff = Backoff(self._retry_timeout)
        timeout = aiohttp.ClientTimeout(total=self._request_timeout)
        reauthenticated = False
        while True:
            endpoint = self.endpoints[self._current]
            self.requests += 1
            began = time.monotonic()
            try:
                async with self._client().post(endpoint + path, json=body, headers=self._headers(),
                                               timeout=timeout) as response:  # fmt: skip
                    data = await response.json(content_type=None)
                    status = response.status
            except _TLS_FAILED as exc:
                raise self._tls_refused(endpoint, exc) from exc
            except NOT_SENT as exc:
                problem = f"{endpoint}: {exc}"
            except MAYBE_SENT as exc:
                if _is_tls(exc):
                    raise self._tls_refused(endpoint, exc) from exc
                if not idempotent:
                    raise StoreUnavailable(
                        f"etcd at {endpoint}: {op} failed ({exc!r}); not resent, it may have "
                        "been applied"
                    ) from exc
                problem = f"{endpoint}: {exc!r}"
            except ValueError as exc:
                raise StoreError(f"etcd at {endpoint}: {path} did not answer JSON; is this "
                                 "an etcd v3 client URL?") from exc  # fmt: skip
            else:
                code = self._code(endpoint, path, status, data)
                if code == 0:
                    self._answering = True
                    if self.observer is not None:
                        self.observer(op, time.monotonic() - began)
                    return data
                message = str(data.get("message") or data.get("error"))
                if code == UNAUTHENTICATED and token and self._credentials and not reauthenticated:
                    await self._authenticate()  # tokens expire; get a new one, once
                    reauthenticated = True
                    continue
                maybe_applied = self._raise_refusal(endpoint, op, code, message)
                if not idempotent and maybe_applied:
                    raise StoreOutcomeUnknown(f"etcd at {endpoint}: {op} failed ({message}); "
                                              "not resent, it may have been applied")  # fmt: skip
                problem = f"{endpoint}: {message} (gRPC code {code})"
            self._fail_over(problem)
            if not await backoff.pause():
                raise StoreUnavailable(self._unavailable(problem))

    @staticmethod
    def _code(endpoint: str, path: str, status: int, data: Any) -> int:
        """The gRPC code of an answer (0: success); not etcd's answer shape is a StoreError."""
        if not isinstance(data, dict):
            raise StoreError(f"etcd at {endpoint}: {path} answered {type(data).__name__} JSON; "
                             "is this an etcd v3 client URL?")  # fmt: skip
        code = data.get("code", 0)
        if status != 200 and not code:
            raise StoreError(f"etcd at {endpoint}: {path} answered HTTP {status}; is this an "
                             "etcd (v3.4 or later) client URL?")  # fmt: skip
        return int(code)

    @staticmethod
    def _raise_refusal(endpoint: str, op: str, code: int, message: str) -> bool:
        """Raise for an error no retry can fix; for one worth retrying, return whether the
        refused request may have been applied all the same."""
        refusal = classify(code, message)
        if refusal.verdict is Verdict.AUTH:
            raise StoreAuthError(f"etcd at {endpoint} refused {op}: {message} (set "
                                 "--rdzv-conf username= and password=)")  # fmt: skip
        if refusal.verdict is Verdict.REFUSED:
            raise StoreRefused(f"etcd at {endpoint} refused {op}: {message} (gRPC code {code})")
        return refusal.maybe_applied

    @staticmethod
    def _tls_refused(endpoint: str, exc: Exception) -> StoreAuthError:
        return StoreAuthError(f"etcd at {endpoint}: TLS failed: {exc} (check --rdzv-conf "
                              "protocol, cacert, cert and key)")  # fmt: skip

    def _unavailable(self, problem: str) -> str:
        hint = ""
        if any(text in problem for text in ("no leader", "timed out", "leader changed",
                                            "deadline exceeded")):  # fmt: skip
            hint = "; the cluster has no quorum (too few members up?)"
        return (
            f"etcd at {self.where} is unavailable after {self._retry_timeout:g}s: {problem}{hint}"
        )

    async def _authenticate(self) -> None:
        """Trade the username and password for a token (etcd's simple tokens expire)."""
        assert self._credentials is not None
        user, password = self._credentials
        self._token = None
        body = {"name": user, "password": password}
        try:
            doc = await self._post("authenticate", "/v3/auth/authenticate", body, token=False)
        except StoreError as exc:
            if "authentication is not enabled" not in str(exc):
                raise StoreAuthError(f"{exc}; user {user!r}") from exc
            log.warning("etcd at %s has authentication off; ignoring username %r", self.where, user)
            self._credentials = None
            return
        self._token = str(doc["token"])

    # -- helpers -----------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return _b64((self._prefix + key).encode())

    def _unkey(self, raw: str) -> str:
        return base64.b64decode(raw).decode()[len(self._prefix) :]

    async def _grant(self, ttl: float) -> str:
        """A new lease of ``ttl`` seconds (rounded up; etcd may raise it to its minimum)."""
        doc = await self._post("lease_grant", "/v3/lease/grant", {"TTL": max(1, math.ceil(ttl))})
        return str(doc["ID"])

    def _put(self, key: str, value: bytes, lease: str | None) -> dict[str, Any]:
        put: dict[str, Any] = {"key": self._key(key), "value": _b64(value)}
        if lease is not None:
            put["lease"] = lease
        return put

    async def _txn(
        self,
        op: str,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]],
        idempotent: bool = True,
    ) -> dict[str, Any]:
        body = {"compare": compare, "success": success, "failure": failure}
        return await self._post(op, "/v3/kv/txn", body, idempotent=idempotent)

    @staticmethod
    def _first_kv(response: dict[str, Any]) -> dict[str, Any] | None:
        kvs = response.get("kvs") or []
        return kvs[0] if kvs else None

    @staticmethod
    def _value(kv: dict[str, Any] | None) -> bytes | None:
        return None if kv is None else base64.b64decode(kv.get("value", ""))

    async def _snapshot(self, keys: Sequence[str]) -> tuple[list[bytes | None], int]:
        """The values of ``keys`` and the revision they were read at (one txn per 128)."""
        values: list[bytes | None] = []
        revision = 0
        for start in range(0, len(keys), MAX_TXN_OPS):
            chunk = keys[start : start + MAX_TXN_OPS]
            ranges = [{"request_range": {"key": self._key(k)}} for k in chunk]
            doc = await self._txn("multi_get", [], ranges, [])
            revision = int(doc["header"]["revision"])
            for response in doc.get("responses", []):
                values.append(self._value(self._first_kv(response["response_range"])))
        if not keys:
            revision = await self.revision()
        return values, revision

    # -- the Store protocol ------------------------------------------------------------------

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        lease = None if ttl is None else await self._grant(ttl)
        doc = await self._post("set", "/v3/kv/put", self._put(key, value, lease))
        return int(doc["header"]["revision"])

    async def get(self, key: str) -> bytes | None:
        doc = await self._post("get", "/v3/kv/range", {"key": self._key(key)})
        return self._value(self._first_kv(doc))

    async def add(self, key: str, delta: int) -> int:
        """A transaction on the revision read; on a lost race, again after a jittered pause
        of up to a round trip, doubling with each loss, so that N adders at once do not
        cost N^2 transactions."""
        doc = await self._post("get", "/v3/kv/range", {"key": self._key(key)})
        kv = self._first_kv(doc)
        round_trip = 0.0
        for lost in itertools.count():
            if lost > 1:  # the others' transactions take about a round trip each: spread out
                await asyncio.sleep(random.uniform(0, round_trip * 2 ** min(lost - 2, 5)))
            began = time.monotonic()
            try:
                total = int(self._value(kv) or b"0") + delta
            except ValueError:
                raise StoreError(f"add: key {key!r} does not hold an integer") from None
            seen = kv.get("mod_revision", "0") if kv else "0"
            compare = [{"key": self._key(key), "target": "MOD", "mod_revision": seen}]
            put = [{"request_put": self._put(key, str(total).encode(), None)}]
            reread = [{"request_range": {"key": self._key(key)}}]
            doc = await self._txn("add", compare, put, reread, idempotent=False)
            round_trip = time.monotonic() - began
            if doc.get("succeeded"):
                return total
            kv = self._first_kv(doc["responses"][0]["response_range"])
        raise AssertionError("unreachable")

    async def compare_set(
        self, key: str, expected: bytes | None, desired: bytes, ttl: float | None = None
    ) -> tuple[bool, bytes | None]:
        lease = None if ttl is None else await self._grant(ttl)
        compare: dict[str, Any] = {"key": self._key(key)}
        if expected is None:
            compare.update(target="CREATE", create_revision="0")
        else:
            compare.update(target="VALUE", value=_b64(expected))
        doc = await self._txn("compare_set", [compare],
                              [{"request_put": self._put(key, desired, lease)}],
                              [{"request_range": {"key": self._key(key)}}])  # fmt: skip
        if doc.get("succeeded"):
            return True, desired
        if lease is not None:
            await self._post("lease_revoke", "/v3/lease/revoke", {"ID": lease})
        return False, self._value(self._first_kv(doc["responses"][0]["response_range"]))

    async def refresh(self, key: str, ttl: float) -> bool:
        """Keep ``key``'s lease alive. The lease keeps the TTL it was granted with; a key
        without one is put again under a new lease (its only change event)."""
        kv = self._first_kv(await self._post("get", "/v3/kv/range", {"key": self._key(key)}))
        if kv is None:
            return False
        lease = kv.get("lease")
        if lease is None:
            await self.set(key, self._value(kv) or b"", ttl)
            return True
        doc = await self._post("refresh", "/v3/lease/keepalive", {"ID": lease})
        return bool(doc.get("result", {}).get("TTL"))

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return (await self._snapshot(keys))[0]

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        """Set ``items``; atomically up to 128 keys (etcd's txn limit), in chunks beyond."""
        lease = None if ttl is None else await self._grant(ttl)
        puts = [{"request_put": self._put(k, v, lease)} for k, v in items.items()]
        revision = await self.revision() if not puts else 0
        for start in range(0, len(puts), MAX_TXN_OPS):
            doc = await self._txn("multi_set", [], puts[start : start + MAX_TXN_OPS], [])
            revision = int(doc["header"]["revision"])
        return revision

    async def delete(self, key: str) -> bool:
        doc = await self._post("delete", "/v3/kv/deleterange", {"key": self._key(key)})
        return int(doc.get("deleted", 0)) > 0

    async def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise StoreError("delete_prefix: the prefix must not be empty")
        start = (self._prefix + prefix).encode()
        body = {"key": _b64(start), "range_end": _b64(prefix_end(start))}
        doc = await self._post("delete_prefix", "/v3/kv/deleterange", body)
        return int(doc.get("deleted", 0))

    async def num_keys(self) -> int:
        start = self._prefix.encode() or b"\0"
        body = {"key": _b64(start), "range_end": _b64(prefix_end(self._prefix.encode())),
                "count_only": True}  # fmt: skip
        return int((await self._post("num_keys", "/v3/kv/range", body)).get("count", 0))

    async def revision(self) -> int:
        probe = _b64(self._prefix.encode() or b"\0")  # any one key; etcd refuses an empty one
        doc = await self._post("revision", "/v3/kv/range", {"key": probe, "count_only": True})
        return int(doc["header"]["revision"])

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        wanted = set(keys)
        scope = _common_prefix(keys)
        values, revision = await self._snapshot(keys)
        missing = {k for k, v in zip(keys, values, strict=True) if v is None}
        while missing:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreTimeout(f"wait: keys {sorted(missing)} still missing after {timeout}s")
            result = await self.watch(scope, revision, left)
            if result.compacted:
                values, revision = await self._snapshot(keys)
                missing = {k for k, v in zip(keys, values, strict=True) if v is None}
                continue
            for event in result.events:
                if event.key in wanted:
                    (missing.add if event.value is None else missing.discard)(event.key)
            revision = result.revision

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        """As the protocol says. On timeout the result's revision stays ``after_revision``:
        etcd may still be replaying history to a watch it has just created."""
        deadline = time.monotonic() + timeout
        backoff = Backoff(self._retry_timeout)
        resyncs = 0
        while True:
            try:
                return await self._watch_once(prefix, after_revision, deadline, resyncs < 3)
            except _Resync as exc:  # nothing of ours changed up to exc.revision: watch from there
                after_revision, resyncs = exc.revision, resyncs + 1
                continue
            except _Retry as exc:
                problem = str(exc)
            self._fail_over(problem)
            if time.monotonic() >= deadline:
                return WatchResult(after_revision)
            if not await backoff.pause():
                raise StoreUnavailable(self._unavailable(problem))

    async def _watch_once(
        self, prefix: str, after_revision: int, deadline: float, resync: bool
    ) -> WatchResult:
        if self._credentials and self._token is None:
            await self._authenticate()
        start = (self._prefix + prefix).encode()
        create = {"key": _b64(start or b"\0"), "range_end": _b64(prefix_end(start)),
                  "start_revision": str(after_revision + 1)}  # fmt: skip
        endpoint = self.endpoints[self._current]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._request_timeout)
        self.requests += 1
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                async with self._client().post(endpoint + "/v3/watch", headers=self._headers(),
                                               json={"create_request": create},
                                               timeout=timeout) as response:  # fmt: skip
                    if response.status != 200:
                        data = await response.json(content_type=None)
                        code = self._code(endpoint, "/v3/watch", response.status, data)
                        self._raise_refusal(endpoint, "watch", code, str(data.get("message")))
                        raise _Retry(f"{endpoint}: {data.get('message')}")
                    self._answering = True
                    return await self._read_watch(endpoint, response, start, after_revision,
                                                  resync)  # fmt: skip
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):  # connecting timed out
                raise _Retry(f"{endpoint}: {exc!r}") from exc
            return WatchResult(after_revision)
        except (*NOT_SENT, *MAYBE_SENT) as exc:
            if _is_tls(exc):
                raise self._tls_refused(endpoint, exc) from exc
            raise _Retry(f"{endpoint}: {exc!r}") from exc
        except ValueError as exc:
            raise StoreError(f"etcd at {endpoint}: /v3/watch did not answer JSON; is this an "
                             "etcd v3 client URL?") from exc  # fmt: skip

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
                raise _Retry(f"{endpoint}: the watch stream ended")
            message = json.loads(line)
            if "error" in message:  # the gateway's in-stream error: {"error": {"grpc_code": ...}}
                error = message["error"]
                code = int(error.get("grpc_code", watch_cancel_code("")))
                self._raise_refusal(endpoint, "watch", code, str(error.get("message")))
                raise _Retry(f"{endpoint}: {error.get('message')}")
            result = message.get("result", {})
            if result.get("canceled"):
                if "compact_revision" in result:
                    return WatchResult(await self.revision(), compacted=True)
                reason = str(result.get("cancel_reason", ""))
                if "Unauthenticated" in reason and self._credentials:
                    self._token = None
                    raise _Retry(f"{endpoint}: {reason}")
                self._raise_refusal(endpoint, "watch", watch_cancel_code(reason), reason)
                raise _Retry(f"{endpoint}: watch cancelled: {reason}")
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
        body: dict[str, Any] = {"key": _b64(start or b"\0"), "range_end": _b64(prefix_end(start))}
        try:
            before = await self._post("watch_catch_up", "/v3/kv/range", {**body, "revision": old})
        except StoreError:
            return None
        after = await self._post("watch_catch_up", "/v3/kv/range", {**body, "revision": new})
        was = {kv["key"]: kv for kv in before.get("kvs", [])}
        events = []
        for kv in after.get("kvs", []):
            if was.pop(kv["key"], {}).get("mod_revision") != kv["mod_revision"]:
                value = base64.b64decode(kv.get("value", ""))
                events.append(KeyEvent(self._unkey(kv["key"]), value, int(kv["mod_revision"])))
        events += [KeyEvent(self._unkey(key), None, new) for key in was]
        return WatchResult(new, tuple(sorted(events, key=lambda e: e.revision)))

    def _events(self, raw: list[dict[str, Any]]) -> WatchResult:
        events = []
        for event in raw:
            kv = event["kv"]
            deleted = event.get("type") == "DELETE"  # PUT, the zero value, is left out
            value = None if deleted else base64.b64decode(kv.get("value", ""))
            events.append(KeyEvent(self._unkey(kv["key"]), value, int(kv["mod_revision"])))
        return WatchResult(max(e.revision for e in events), tuple(events))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _is_tls(exc: BaseException) -> bool:
    """A TLS handshake or certificate failure: no retry can fix it."""
    return isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError) or (
        isinstance(exc, aiohttp.ClientOSError) and "[SSL" in str(exc)
    )


def _common_prefix(keys: Sequence[str]) -> str:
    """The longest prefix every key shares (what one watch must cover)."""
    if not keys:
        return ""
    low, high = min(keys), max(keys)
    size = 0
    while size < min(len(low), len(high)) and low[size] == high[size]:
        size += 1
    return low[:size]


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the running loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
