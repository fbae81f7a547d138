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

Requests, failover, retries and auth are the gateway's (:mod:`agentd.store.etcd.gateway`);
a write that may have been applied is resent only when resending cannot change its outcome
(everything but ``add``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentd.store.api import StoreError, StoreTimeout, WatchResult
from agentd.store.etcd.gateway import COUNTER, EtcdGateway, LeaseLapsed, b64, kv_value, prefix_end
from agentd.store.etcd.leases import leased
from agentd.store.etcd.watch import EtcdWatch, common_prefix

log = logging.getLogger(__name__)

DEFAULT_PORT = 2379
MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: longer multi-key requests are split."""
_Guard = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]
"""The compares, puts and counting reads ``add_once`` adds to an add's transaction."""


def _any_found(reads: list[dict[str, Any]]) -> bool:
    """Whether a guard's counting reads (a failed transaction's answers) found a key."""
    return any(int(r["response_range"].get("count", 0)) for r in reads)


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
        self._gw = EtcdGateway(  # requests, failover, retries, auth
            endpoints,
            ssl_context=ssl_context,
            username=username,
            password=password,
            retry_timeout=retry_timeout,
            request_timeout=request_timeout,
        )
        self._prefix = prefix
        self._watch = EtcdWatch(self._gw, prefix, self.revision)

    @property
    def endpoints(self) -> list[str]:
        return self._gw.endpoints

    @property
    def where(self) -> str:
        """The endpoints, for messages."""
        return self._gw.where

    @property
    def requests(self) -> int:
        """Requests sent, retries included (for benchmarks and metrics)."""
        return self._gw.requests

    @property
    def observer(self) -> Callable[[str, float], None] | None:
        """Told (operation, seconds) after each answered request but watches (metrics)."""
        return self._gw.observer

    @observer.setter
    def observer(self, observer: Callable[[str, float], None] | None) -> None:
        self._gw.observer = observer

    # -- helpers -----------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return b64((self._prefix + key).encode())

    def _put(self, key: str, value: bytes, lease: str | None) -> dict[str, Any]:
        put: dict[str, Any] = {"key": self._key(key), "value": b64(value)}
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
        return await self._gw.post(op, "/v3/kv/txn", body, idempotent=idempotent)

    @staticmethod
    def _first_kv(response: dict[str, Any]) -> dict[str, Any] | None:
        kvs = response.get("kvs") or []
        return kvs[0] if kvs else None

    @staticmethod
    def _value(kv: dict[str, Any] | None) -> bytes | None:
        return kv_value(kv)

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
        async def put(lease: str | None) -> dict[str, Any]:
            return await self._gw.post("set", "/v3/kv/put", self._put(key, value, lease))

        return int((await leased(self._gw, ttl, put))["header"]["revision"])

    async def get(self, key: str) -> bytes | None:
        doc = await self._gw.post("get", "/v3/kv/range", {"key": self._key(key)})
        return self._value(self._first_kv(doc))

    async def add(self, key: str, delta: int) -> int:
        """``delta`` 1 (arrivals) on a key that is missing or counted by its version (see
        :data:`~agentd.store.etcd.gateway.COUNTER`): one transaction, so N nodes arriving at
        once make N transactions, not N^2. Any other add is a transaction on the revision
        read, and the key holds the integer from then on."""
        if delta == 1:
            counted, kv, _ = await self._count_one(key)
            if counted is not None:
                return counted
        else:
            kv = self._first_kv(await self._gw.post("get", "/v3/kv/range", {"key": self._key(key)}))
        total = await self._add_to_value(key, delta, kv)
        assert total is not None  # unguarded: it returns only once added
        return total

    async def _count_one(
        self, key: str, guard: _Guard | None = None
    ) -> tuple[int | None, dict[str, Any] | None, bool]:
        """One more version of a counted or missing key, in one transaction: its count;
        else (None, the key as read: it holds an integer of its own). With ``guard``
        (:meth:`add_once`'s compares, puts and counting reads), only while no guarded key
        exists: else (None, the key, True)."""
        compares, puts, reads = guard or ([], [], [])
        me = self._key(key)
        count = [*puts, {"request_put": self._put(key, COUNTER, None)}]
        count.append({"request_range": {"key": me}})
        counted = {"key": me, "target": "VALUE", "value": b64(COUNTER)}
        if_counted = {
            "compare": [counted, *compares],
            "success": count,
            "failure": [*reads, {"request_range": {"key": me}}],
        }
        missing = {"key": me, "target": "CREATE", "create_revision": "0"}
        op, idempotent = ("add", False) if guard is None else ("add_once", True)
        doc = await self._txn(
            op, [missing, *compares], count, [{"request_txn": if_counted}], idempotent
        )
        if not doc.get("succeeded"):
            doc = doc["responses"][0]["response_txn"]
        responses = doc["responses"]
        kv = self._first_kv(responses[-1]["response_range"])
        if doc.get("succeeded") and kv is not None:
            return int(kv["version"]), kv, False
        return None, kv, _any_found(responses[:-1])

    async def add_once(
        self, counter: str, marker: str, mark: bytes, absent: Sequence[str] = ()
    ) -> tuple[bool, int]:
        """As :meth:`add` of 1, guarded: the count by version where the counter is missing
        or counted (N marks at once make N transactions), else a transaction on its
        revision as read, each comparing ``marker`` and ``absent`` missing. Resent where
        an answer was lost: a resend finds the marker and counts nothing twice."""
        if len(absent) + 3 >= MAX_TXN_OPS:
            raise StoreError(f"add_once: absent names {len(absent)} keys, etcd allows fewer")
        guarded = [marker, *absent]
        compare = [
            {"key": self._key(k), "target": "VERSION", "version": "0", "result": "EQUAL"}
            for k in guarded
        ]
        reads = [{"request_range": {"key": self._key(k), "count_only": True}} for k in guarded]
        guard = (compare, [{"request_put": self._put(marker, mark, None)}], reads)
        counted, kv, refused = await self._count_one(counter, guard)
        if counted is not None:
            return True, counted
        if not refused:
            total = await self._add_to_value(counter, 1, kv, guard)
            if total is not None:
                return True, total
        held, value = await self.multi_get([marker, counter])
        return held == mark, int(value or b"0")

    async def _add_to_value(
        self, key: str, delta: int, kv: dict[str, Any] | None, guard: _Guard | None = None
    ) -> int | None:
        """A transaction on the revision of ``kv`` (as read); on a lost race, again after a
        jittered pause of up to a round trip, doubling with each loss. With ``guard``
        (compares, puts and counting reads of :meth:`add_once`), None once a guarded key
        is found to exist."""
        compares, puts, reads = guard or ([], [], [])
        op = "add" if guard is None else "add_once"
        round_trip = 0.0
        for lost in itertools.count():
            if lost > 1:  # the others' transactions take about a round trip each: spread out
                await asyncio.sleep(random.uniform(0, round_trip * 2 ** min(lost - 2, 5)))
            began = time.monotonic()
            try:
                total = int(self._value(kv) or b"0") + delta
            except ValueError:
                raise StoreError(f"{op}: key {key!r} does not hold an integer") from None
            seen = kv.get("mod_revision", "0") if kv else "0"
            compare = [{"key": self._key(key), "target": "MOD", "mod_revision": seen}, *compares]
            put = [{"request_put": self._put(key, str(total).encode(), None)}, *puts]
            reread = [{"request_range": {"key": self._key(key)}}, *reads]
            doc = await self._txn(op, compare, put, reread, idempotent=guard is not None)
            round_trip = time.monotonic() - began
            if doc.get("succeeded"):
                return total
            responses = doc["responses"]
            kv = self._first_kv(responses[0]["response_range"])
            if _any_found(responses[1:]):
                return None
        raise AssertionError("unreachable")

    async def compare_set(
        self,
        key: str,
        expected: bytes | None,
        desired: bytes,
        ttl: float | None = None,
        present: Sequence[str] = (),
        absent: Sequence[str] = (),
    ) -> tuple[bool, bytes | None]:
        """The keys of ``absent``, and of ``present`` as far as etcd's limit on a
        transaction's operations allows, are compared in the transaction; the rest of
        ``present`` are read just before it (etcd keeps its state through restarts, so no
        empty store can come between)."""
        if len(absent) >= MAX_TXN_OPS:
            raise StoreError(f"compare_set: absent names {len(absent)} keys, etcd allows fewer")
        room = MAX_TXN_OPS - 1 - len(absent)
        inside, beyond = list(present[:room]), list(present[room:])
        if beyond and None in await self.multi_get(beyond):
            return False, await self.get(key)
        compare: dict[str, Any] = {"key": self._key(key)}
        if expected is None:
            compare.update(target="CREATE", create_revision="0")
        else:
            compare.update(target="VALUE", value=b64(expected))
        exist = [
            {"key": self._key(k), "target": "VERSION", "version": "0", "result": "GREATER"}
            for k in inside
        ]
        exist += [
            {"key": self._key(k), "target": "VERSION", "version": "0", "result": "EQUAL"}
            for k in absent
        ]

        async def txn(lease: str | None) -> dict[str, Any]:
            doc = await self._txn(
                "compare_set",
                [compare, *exist],
                [{"request_put": self._put(key, desired, lease)}],
                [{"request_range": {"key": self._key(key)}}],
            )
            if lease is not None and not doc.get("succeeded"):
                with contextlib.suppress(LeaseLapsed):  # gone already: nothing to revoke
                    await self._gw.post("lease_revoke", "/v3/lease/revoke", {"ID": lease})
            return doc

        doc = await leased(self._gw, ttl, txn)
        if doc.get("succeeded"):
            return True, desired
        return False, self._value(self._first_kv(doc["responses"][0]["response_range"]))

    async def refresh(self, key: str, ttl: float) -> bool:
        """Keep ``key``'s lease alive. The lease keeps the TTL it was granted with; a key
        without one is put again under a new lease (its only change event)."""
        kv = self._first_kv(await self._gw.post("get", "/v3/kv/range", {"key": self._key(key)}))
        if kv is None:
            return False
        lease = kv.get("lease")
        if lease is None:
            await self.set(key, self._value(kv) or b"", ttl)
            return True
        doc = await self._gw.post("refresh", "/v3/lease/keepalive", {"ID": lease})
        return bool(doc.get("result", {}).get("TTL"))

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return (await self._snapshot(keys))[0]

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        """Set ``items``; atomically up to 128 keys (etcd's txn limit), in chunks beyond."""
        if not items:
            return await self.revision()

        async def txns(lease: str | None) -> int:
            puts = [{"request_put": self._put(k, v, lease)} for k, v in items.items()]
            for start in range(0, len(puts), MAX_TXN_OPS):
                doc = await self._txn("multi_set", [], puts[start : start + MAX_TXN_OPS], [])
            return int(doc["header"]["revision"])

        return await leased(self._gw, ttl, txns)

    async def delete(self, key: str) -> bool:
        doc = await self._gw.post("delete", "/v3/kv/deleterange", {"key": self._key(key)})
        return int(doc.get("deleted", 0)) > 0

    async def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise StoreError("delete_prefix: the prefix must not be empty")
        start = (self._prefix + prefix).encode()
        body = {"key": b64(start), "range_end": b64(prefix_end(start))}
        doc = await self._gw.post("delete_prefix", "/v3/kv/deleterange", body)
        return int(doc.get("deleted", 0))

    async def num_keys(self) -> int:
        start = self._prefix.encode() or b"\0"
        body = {
            "key": b64(start),
            "range_end": b64(prefix_end(self._prefix.encode())),
            "count_only": True,
        }
        return int((await self._gw.post("num_keys", "/v3/kv/range", body)).get("count", 0))

    async def revision(self) -> int:
        probe = b64(self._prefix.encode() or b"\0")  # any one key; etcd refuses an empty one
        doc = await self._gw.post("revision", "/v3/kv/range", {"key": probe, "count_only": True})
        return int(doc["header"]["revision"])

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        wanted = set(keys)
        scope = common_prefix(keys)
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
        """As the protocol says (see :class:`~agentd.store.etcd.watch.EtcdWatch`)."""
        return await self._watch.watch(prefix, after_revision, timeout)

    async def close(self) -> None:
        await self._gw.close()
