"""A write whose lease lapsed between its grant and the write, on a real etcd.

A client or an etcd stalled a TTL long between the two (a loaded 2-core machine: the
suite's first run of 2026-12-01) found the lease gone, and etcd refused the heartbeat's
write: "requested lease not found" was StoreRefused, and the rendezvous failed with it.
Here the lapse is made exact: each granted lease is revoked before its write is sent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentd.store.api import StoreUnavailable
from agentd.store.etcd import leases
from agentd.store.etcd.store import EtcdStore
from tests.helpers.etcd_server import etcd_call


class Lapsing:
    """Revokes the next ``count`` leases the store is granted, as soon as they are granted."""

    def __init__(self, store: EtcdStore, url: str) -> None:
        self.count = 0
        self.granted = 0
        self.revoked: list[str] = []
        gateway = store._gw
        post = gateway.post

        async def granted_then_lapsed(op: str, path: str, body: Any, **kw: Any) -> Any:
            doc = await post(op, path, body, **kw)
            self.granted += op == "lease_grant"
            if op == "lease_grant" and self.count > 0:
                self.count -= 1
                etcd_call(url, "/v3/lease/revoke", {"ID": doc["ID"]})
                self.revoked.append(str(doc["ID"]))
            return doc

        gateway.post = granted_then_lapsed  # type: ignore[method-assign]


@pytest.fixture
async def store(etcd_cluster) -> AsyncIterator[tuple[EtcdStore, Lapsing]]:
    etcd = EtcdStore(etcd_cluster.urls, prefix=f"/leases/{uuid.uuid4().hex}/")
    yield etcd, Lapsing(etcd, etcd_cluster.urls[0])
    await etcd.close()


async def lease_of(store: EtcdStore, key: str) -> str | None:
    kv = store._first_kv(await store._gw.post("get", "/v3/kv/range", {"key": store._key(key)}))
    return None if kv is None else kv.get("lease")


async def test_a_set_whose_lease_lapsed_first_is_sent_again_under_a_new_one(store, caplog):
    etcd, lapsing = store
    lapsing.count = 1
    with caplog.at_level(logging.WARNING, logger="agentd.store.etcd.leases"):
        await etcd.set("hb/node0", b"alive", ttl=5)
    assert await etcd.get("hb/node0") == b"alive"
    lease = await lease_of(etcd, "hb/node0")
    assert lease is not None and lease not in lapsing.revoked
    assert await etcd.refresh("hb/node0", 5)  # a live lease
    assert "requested lease not found" in caplog.text and "under a new lease" in caplog.text


async def test_a_compare_set_whose_lease_lapsed_first_is_sent_again(store):
    etcd, lapsing = store
    lapsing.count = 1
    assert await etcd.compare_set("drain", None, b"node1", ttl=5) == (True, b"node1")
    assert await lease_of(etcd, "drain") not in (None, *lapsing.revoked)
    lapsing.count, lapsing.granted = 1, 0  # refused by its compare: the value stands, and
    assert await etcd.compare_set("drain", None, b"node2", ttl=5) == (False, b"node1")
    assert lapsing.granted == 1  # the lapsed lease is not sent again: it had nothing to hold


async def test_a_multi_set_whose_lease_lapsed_first_sets_every_key_under_a_new_one(store):
    etcd, lapsing = store
    lapsing.count = 1
    items = {f"many/{i:03}": str(i).encode() for i in range(200)}  # two transactions
    await etcd.multi_set(items, ttl=5)
    assert await etcd.multi_get(list(items)) == list(items.values())
    first, last = await lease_of(etcd, "many/000"), await lease_of(etcd, "many/199")
    assert first == last and first not in (None, *lapsing.revoked)


async def test_leases_that_lapse_every_time_are_store_unavailable_naming_the_ttl(store):
    etcd, lapsing = store
    lapsing.count = leases.LEASE_TRIES
    with pytest.raises(StoreUnavailable, match="3 leases of 5s lapsed"):
        await etcd.set("hb/node0", b"alive", ttl=5)
    assert await etcd.get("hb/node0") is None
