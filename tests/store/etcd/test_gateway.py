"""EtcdStore against a scripted gateway on 127.0.0.1: transient refusals are retried with
backoff, permanent ones end at once (exit 3), and a write that may have been applied is not
resent. (The real cluster's outages are in tests/integration/test_etcd.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from agentd.store.api import StoreOutcomeUnknown, StoreRefused, StoreUnavailable
from agentd.store.etcd.gateway import b64
from agentd.store.etcd.store import EtcdStore

Answer = tuple[int, dict[str, object]]
DEADLINE = (500, {"code": 2, "message": "context deadline exceeded"})
SUCCEEDED = (200, {"header": {"revision": "7"}, "succeeded": True})


class Gateway:
    """Answers each POST with the next scripted answer (the last one repeats)."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.paths: list[str] = []
        self.hold: asyncio.Event | None = None
        """Set: each request waits for it before it is answered."""

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if self.hold is not None:
            await self.hold.wait()
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return web.json_response(body, status=status)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Gateway, Callable[..., EtcdStore]]]:
    fake = Gateway()
    app = web.Application()
    app.router.add_post("/{path:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    stores: list[EtcdStore] = []

    def store(retry_timeout: float = 10.0) -> EtcdStore:
        stores.append(EtcdStore([f"http://127.0.0.1:{port}"], retry_timeout=retry_timeout))
        return stores[-1]

    yield fake, store
    for each in stores:
        await each.close()
    await runner.cleanup()


async def test_deadline_exceeded_inside_etcd_is_retried_until_it_answers(gateway):
    fake, store = gateway
    fake.answers = [
        DEADLINE,
        DEADLINE,
        (503, {"code": 14, "message": "etcdserver: no leader"}),
        SUCCEEDED,
    ]
    assert await store().compare_set("k", None, b"v") == (True, b"v")
    assert fake.paths == ["/v3/kv/txn"] * 4


async def test_a_cluster_that_stays_unavailable_is_store_unavailable_saying_why(gateway):
    fake, store = gateway
    fake.answers = [DEADLINE]
    with pytest.raises(StoreUnavailable) as caught:
        await store(retry_timeout=0.3).set("k", b"v")
    text = str(caught.value)
    assert "context deadline exceeded (gRPC code 2)" in text and "no quorum" in text, text
    assert caught.value.exit_code == 3 and len(fake.paths) > 1


async def test_a_refused_request_ends_at_once_with_exit_3(gateway):
    fake, store = gateway
    fake.answers = [(400, {"code": 3, "message": "etcdserver: too many operations in txn request"})]
    with pytest.raises(StoreRefused) as caught:
        await store().compare_set("k", None, b"v")
    assert caught.value.exit_code == 3 and len(fake.paths) == 1
    assert "refused compare_set: etcdserver: too many operations" in str(caught.value)


async def test_an_add_that_may_have_been_applied_is_not_resent(gateway):
    fake, store = gateway
    fake.answers = [(200, {"header": {"revision": "3"}}), DEADLINE]  # the read, then the txn
    with pytest.raises(StoreOutcomeUnknown, match="not resent, it may have been applied"):
        await store().add("counter", 2)
    assert fake.paths == ["/v3/kv/range", "/v3/kv/txn"]


async def test_an_arrival_that_may_have_been_counted_is_not_resent(gateway):
    fake, store = gateway
    fake.answers = [DEADLINE]  # one txn: the count, by the key's version
    with pytest.raises(StoreOutcomeUnknown, match="not resent, it may have been applied"):
        await store().add("counter", 1)
    assert fake.paths == ["/v3/kv/txn"]


async def test_a_count_once_that_may_have_been_applied_is_resent(gateway):
    """The resend finds the marker (the first try was applied): counted, once, and the
    caller told so, with the count read back."""
    fake, store = gateway
    kv = {"kvs": [{"value": b64(b"1"), "mod_revision": "4", "version": "1"}]}
    inner = {"succeeded": False, "responses": [counted(1), {"response_range": kv}]}
    marked = {"succeeded": False, "responses": [{"response_txn": inner}]}
    read = {"responses": [{"response_range": {"kvs": [{"value": b64(b"left")}]}}]}
    read["responses"].append({"response_range": kv})
    fake.answers = [DEADLINE, (200, {"header": {"revision": "4"}, **marked})]
    fake.answers += [(200, {"header": {"revision": "4"}, **read})]
    assert await store().add_once("gone", "gone/a", b"left") == (True, 1)
    assert fake.paths == ["/v3/kv/txn"] * 3


def counted(count: int) -> dict[str, object]:
    return {"response_range": {"count": str(count)}}


async def test_an_add_refused_before_raft_is_resent(gateway):
    fake, store = gateway
    busy = (429, {"code": 8, "message": "etcdserver: too many requests"})
    fake.answers = [(200, {"header": {"revision": "3"}}), busy, SUCCEEDED]
    assert await store().add("counter", 2) == 2
    assert fake.paths == ["/v3/kv/range", "/v3/kv/txn", "/v3/kv/txn"]


async def test_a_request_under_way_when_the_store_closes_is_store_unavailable(gateway):
    """Before: aiohttp's "Connector is closed" escaped a drain watch at an agent's
    shutdown (a traceback from "Could not stop DrainService"); the store's callers
    handle StoreError, and get it."""
    fake, store = gateway
    fake.answers = [SUCCEEDED]
    fake.hold = asyncio.Event()
    etcd = store()
    under_way = asyncio.ensure_future(etcd.compare_set("k", None, b"v"))
    async with asyncio.timeout(10):
        while not fake.paths:
            await asyncio.sleep(0.01)
    await etcd.close()
    with pytest.raises(StoreUnavailable, match="the client was closed"):
        await asyncio.wait_for(under_way, 10)
    with pytest.raises(StoreUnavailable, match="the client was closed"):
        await etcd.compare_set("k", None, b"v")
    fake.hold.set()


async def test_a_member_that_answered_nothing_is_passed_over_while_the_others_elect():
    """Member a stalls (holds every request); b and c say once each that their cluster is
    electing a leader. Each answer moved the client one member on, round to the stalled a
    again; it is passed over now, and b, asked again, answers."""
    stalled, electing = Gateway(), [Gateway(), Gateway()]
    stalled.hold, stalled.answers = asyncio.Event(), [SUCCEEDED]
    for fake in electing:
        fake.answers = [(503, {"code": 14, "message": "etcdserver: leader changed"}), SUCCEEDED]
    runners = []
    for fake in (stalled, *electing):
        app = web.Application()
        app.router.add_post("/{path:.*}", fake.handle)
        runners.append(web.AppRunner(app))
        await runners[-1].setup()
        await web.TCPSite(runners[-1], "127.0.0.1", 0).start()
    urls = [f"http://127.0.0.1:{runner.addresses[0][1]}" for runner in runners]
    store = EtcdStore(urls, request_timeout=0.3)
    try:
        assert await store.compare_set("k", None, b"v") == (True, b"v")
    finally:
        stalled.hold.set()
        await store.close()
        for runner in runners:
            await runner.cleanup()
    assert [len(f.paths) for f in (stalled, *electing)] == [1, 2, 1]
