"""The Store contract, run against every backend: one suite, parametrized."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from agentd.store.api import KeyEvent, Store, StoreError, StoreTimeout
from agentd.store.etcd.store import EtcdStore
from agentd.store.http_client import HttpStore
from agentd.store.memory import MemoryStore
from agentd.store.server import StoreServer
from tests.helpers.etcd_server import etcd_call


@pytest.fixture(params=["memory", "http", "etcd"])
async def store(request) -> AsyncIterator[Store]:
    if request.param == "etcd":
        cluster = request.getfixturevalue("etcd_cluster")
        etcd = EtcdStore(cluster.urls, prefix=f"/contract/{uuid.uuid4().hex}/")
        yield etcd
        await etcd.close()
        return
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.close()
        return
    server = StoreServer("127.0.0.1", 0, token="s3cret")
    await server.start()
    client = HttpStore(server.endpoint, token="s3cret")
    try:
        yield client
    finally:
        await client.close()
        await server.stop()


async def test_set_get_delete(store: Store):
    assert await store.get("a") is None
    rev = await store.set("a", b"\x00\xffbytes")
    assert rev > 0
    assert await store.get("a") == b"\x00\xffbytes"
    assert await store.num_keys() == 1
    assert await store.delete("a") is True
    assert await store.delete("a") is False
    assert await store.get("a") is None


async def test_delete_prefix_removes_a_subtree_only(store: Store):
    await store.multi_set({"r/1/a": b"1", "r/1/b": b"2", "r/10/a": b"3", "r/2/a": b"4"})
    revision = await store.revision()
    assert await store.delete_prefix("r/1/") == 2
    assert await store.multi_get(["r/1/a", "r/1/b", "r/10/a", "r/2/a"]) == [None, None, b"3", b"4"]
    seen = await store.watch("r/1/", revision, timeout=5)  # deletions are changes
    assert {(e.key, e.value) for e in seen.events} == {("r/1/a", None), ("r/1/b", None)}
    assert await store.delete_prefix("r/nothing/") == 0
    with pytest.raises(StoreError):
        await store.delete_prefix("")


async def test_revisions_grow(store: Store):
    first = await store.set("k", b"1")
    second = await store.set("k", b"2")
    assert second > first and await store.revision() == second


async def test_add(store: Store):
    assert await store.add("n", 5) == 5
    assert await store.add("n", -2) == 3
    await store.set("text", b"abc")
    with pytest.raises(StoreError, match="does not hold an integer"):
        await store.add("text", 1)


async def test_arrivals_each_get_their_own_count_and_read_as_an_integer(store: Store):
    """Many nodes adding 1 at once (a round's arrivals); etcd counts them by the key's
    version, which reads, watches, deletes and adds like any integer key."""
    revision = await store.revision()
    counts = await asyncio.gather(*(store.add("round/join", 1) for _ in range(24)))
    assert sorted(counts) == list(range(1, 25))
    assert await store.get("round/join") == b"24"
    assert await store.multi_get(["round/join"]) == [b"24"]
    seen = await store.watch("round/", revision, timeout=5)
    assert seen.events[-1].value == b"24"
    assert await store.add("round/join", 10) == 34  # any other delta: an integer from here
    assert await store.add("round/join", 1) == 35
    assert await store.delete("round/join") and await store.add("round/join", 1) == 1


async def test_add_once_counts_each_marker_once_and_says_whose_mark_it_holds(store: Store):
    """A member counted gone: a resend of the same mark (its first answer lost) counts
    nothing twice and says it was counted; another mark of the same marker is refused."""
    assert await store.add_once("gone", "gone/a", b"left") == (True, 1)
    assert await store.add_once("gone", "gone/a", b"left") == (True, 1)
    assert await store.add_once("gone", "gone/a", b"lapsed") == (False, 1)
    assert await store.add_once("gone", "gone/b", b"lapsed") == (True, 2)
    assert await store.multi_get(["gone", "gone/a", "gone/b"]) == [b"2", b"left", b"lapsed"]
    await store.set("text", b"abc")
    with pytest.raises(StoreError, match="does not hold an integer"):
        await store.add_once("text", "text/a", b"left")
    assert await store.get("text/a") is None


async def test_add_once_only_while_every_named_key_is_absent(store: Store):
    """A lapsed lease's gone mark names the heartbeat: a store where it beats counts
    nothing; on a counter another ``add`` made (etcd counts by version), it adds on."""
    await store.set("hb/live", b"1", ttl=30)
    assert await store.add_once("gone", "gone/live", b"lapsed", ["hb/live"]) == (False, 0)
    assert await store.multi_get(["gone", "gone/live"]) == [None, None]
    assert await store.add("gone", 1) == 1
    assert await store.add_once("gone", "gone/lost", b"lapsed", ["hb/lost"]) == (True, 2)


async def test_add_once_from_many_at_once_counts_each_marker_once(store: Store):
    marks = [store.add_once("n", f"n/{i % 8}", b"left") for i in range(24)]
    assert all(counted for counted, _ in await asyncio.gather(*marks))
    assert await store.get("n") == b"8"


async def test_compare_set(store: Store):
    assert await store.compare_set("c", None, b"first") == (True, b"first")
    assert await store.compare_set("c", None, b"again") == (False, b"first")
    assert await store.compare_set("c", b"wrong", b"x") == (False, b"first")
    assert await store.compare_set("c", b"first", b"second") == (True, b"second")


async def test_compare_set_only_while_every_named_key_is_present(store: Store):
    """A round's seal names its members' heartbeats: a store that lacks one refuses it."""
    await store.multi_set({"hb/a": b"1", "hb/b": b"1"})
    assert await store.compare_set("s", None, b"x", present=["hb/a", "hb/c"]) == (False, None)
    assert await store.get("s") is None
    assert await store.compare_set("s", None, b"x", present=["hb/a", "hb/b"]) == (True, b"x")
    many = {f"hb/{i:03}": b"1" for i in range(200)}  # etcd: beyond one transaction's compares
    await store.multi_set(many)
    assert await store.compare_set("t", None, b"y", present=[*many, "hb/gone"]) == (False, None)
    assert await store.compare_set("t", None, b"y", present=[*many]) == (True, b"y")


async def test_compare_set_only_while_every_named_key_is_absent(store: Store):
    """A lapsed lease's gone mark names the heartbeat: a store where it beats refuses it."""
    await store.set("hb/live", b"1", ttl=30)
    marked = await store.compare_set("gone/live", None, b"1", absent=["hb/live"])
    assert marked == (False, None)
    assert await store.get("gone/live") is None
    assert await store.compare_set("gone/lost", None, b"1", absent=["hb/lost"]) == (True, b"1")
    both = await store.compare_set("u", None, b"z", present=["hb/live"], absent=["hb/lost"])
    assert both == (True, b"z")


async def test_multi(store: Store):
    await store.multi_set({"m/1": b"one", "m/2": b"two"})
    assert await store.multi_get(["m/1", "m/2", "m/3"]) == [b"one", b"two", None]


async def test_multi_beyond_one_transaction(store: Store):
    items = {f"many/{i:03}": str(i).encode() for i in range(300)}  # etcd: 128 ops per txn
    await store.multi_set(items)
    assert await store.multi_get([*items, "many/none"]) == [*items.values(), None]
    await store.wait(list(items), timeout=10)


async def first_deletion(store: Store, prefix: str, after: int, poll: float) -> KeyEvent:
    """The first key under ``prefix`` deleted (or expired) after revision ``after``, as
    watches of ``poll`` seconds see it, within 10 s."""
    async with asyncio.timeout(10):
        while True:
            result = await store.watch(prefix, after, timeout=poll)
            after = result.revision
            gone = next((e for e in result.events if e.value is None), None)
            if gone is not None:
                return gone


async def test_ttl_key_expires_as_a_change(store: Store):
    start = await store.revision()
    await store.set("hb/node0", b"alive", ttl=0.2)
    assert await store.get("hb/node0") == b"alive"
    gone = await first_deletion(store, "hb/", start, poll=5)
    assert gone.key == "hb/node0"
    assert await store.get("hb/node0") is None


async def test_a_shorter_ttl_set_after_a_longer_one_expires_first(store: Store):
    """The store's expiry timer, armed for the longer key, moves earlier for the shorter:
    the expiry wakes the watch (a read after the watch's timeout would expire it lazily)."""
    start = await store.revision()
    await store.set("hb/long", b"1", ttl=60)
    await store.set("hb/short", b"1", ttl=0.2)
    gone = await first_deletion(store, "hb/", start, poll=15)  # 15: past the 10 s limit
    assert gone.key == "hb/short"
    assert await store.get("hb/long") == b"1"


async def test_ttl_refresh_keeps_a_key(store: Store):
    await store.set("hb", b"1", ttl=0.3)
    for _ in range(3):
        await asyncio.sleep(0.15)
        await store.set("hb", b"1", ttl=0.3)
    assert await store.get("hb") == b"1"


async def test_refresh_extends_a_ttl_without_a_change(store: Store):
    await store.set("hb/a", b"1", ttl=0.5)
    quiet = await store.revision()
    for _ in range(4):
        await asyncio.sleep(0.2)
        assert await store.refresh("hb/a", 0.5) is True
    assert await store.get("hb/a") == b"1"
    result = await store.watch("hb/", quiet, timeout=0.05)
    assert result.events == ()  # heartbeats are not changes
    if not isinstance(store, EtcdStore):  # etcd's revision is the shared cluster's: another
        assert result.revision == quiet  # test's lease that expires meanwhile moves it
    assert await store.refresh("hb/missing", 1.0) is False


async def test_watch_from_a_revision_the_store_never_had_says_compacted(store: Store):
    now = await store.set("k", b"v")
    result = await store.watch("", now + 100, timeout=5)
    assert result.compacted and now <= result.revision < now + 100
    if not isinstance(store, EtcdStore):  # etcd's revision is the shared cluster's: another
        assert result.revision == now  # test's lease that expired meanwhile moved it (CI,
        # 2026-12-02: 428 for 427)


async def test_wait(store: Store):
    async def later() -> None:
        await asyncio.sleep(0.05)
        await store.set("w/1", b"x")
        await store.set("w/2", b"y")

    task = asyncio.ensure_future(later())
    await store.wait(["w/1", "w/2"], timeout=10)
    await task
    with pytest.raises(StoreTimeout, match="still missing"):
        await store.wait(["w/never"], timeout=0.1)


async def test_watch_sees_changes_after_a_revision_under_a_prefix(store: Store):
    base = await store.set("other", b"-")

    async def writer() -> None:
        await asyncio.sleep(0.05)
        await store.set("gen/1", b"a")
        await store.set("elsewhere", b"b")
        await store.delete("gen/1")

    task = asyncio.ensure_future(writer())
    result = await store.watch("gen/", base, timeout=10)
    seen = list(result.events)
    await task
    while len(seen) < 2:
        more = await store.watch("gen/", seen[-1].revision, timeout=10)
        seen += more.events
    assert [(e.key, e.value) for e in seen] == [("gen/1", b"a"), ("gen/1", None)]
    assert all(e.revision > base for e in seen)


async def test_watch_times_out_empty(store: Store):
    now = await store.revision()
    result = await store.watch("nothing/", now, timeout=0.05)
    assert result.events == () and result.revision == now and not result.compacted


async def test_watch_returns_past_changes_at_once(store: Store):
    before = await store.revision()
    await store.set("p/x", b"1")
    result = await store.watch("p/", before, timeout=10)
    assert [e.key for e in result.events] == ["p/x"]


async def test_watch_after_a_real_etcd_compaction_says_compacted(etcd_cluster):
    store = EtcdStore(etcd_cluster.urls, prefix=f"/contract/{uuid.uuid4().hex}/")
    try:
        old = await store.set("gen", b"1")
        now = await store.set("gen", b"2")
        etcd_call(etcd_cluster.urls[0], "/v3/kv/compaction", {"revision": str(now)})
        result = await store.watch("", old - 1, timeout=5)  # from old: compacted away
        assert result.compacted and result.revision >= now
        assert (await store.watch("", now - 1, timeout=5)).events[-1].value == b"2"
    finally:
        await store.close()


async def test_a_watch_from_the_past_sees_deletions_and_then_live_changes(store: Store):
    await store.set("d/x", b"1")
    before = await store.revision()
    await store.delete("d/x")
    await store.set("other/y", b"2")
    result = await store.watch("d/", before, timeout=10)
    assert [(e.key, e.value) for e in result.events] == [("d/x", None)]
    # nothing under q/ changed since `before`: the watch waits for a live change
    later = asyncio.ensure_future(store.watch("q/", before, timeout=10))
    await asyncio.sleep(0.05)
    await store.set("q/z", b"3")
    assert [(e.key, e.value) for e in (await later).events] == [("q/z", b"3")]
