"""The drain protocol's store on node 0's TCPStore (a static job of several nodes): its
revisions and watches made of keys and waits, on a real store on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentd.rendezvous.drains import Drains
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.static_drains import COUNTER, StaticDrainStore
from agentd.store.api import StoreTimeout, StoreUnavailable
from agentd.tcpstore.client import TCPStoreClient
from agentd.tcpstore.server import TCPStoreServer


@pytest.fixture
async def server() -> AsyncIterator[TCPStoreServer]:
    server = TCPStoreServer("127.0.0.1", 0)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stores(server) -> AsyncIterator[list[StaticDrainStore]]:
    """Two agents' drain stores on ``server`` (closed after the test)."""
    made = [StaticDrainStore("127.0.0.1", lambda: server.port) for _ in range(2)]
    yield made
    for store in made:
        await store.close()


async def test_a_watch_wakes_at_a_write_made_after_its_revision(stores):
    watcher, writer = stores
    before = await watcher.revision()
    watching = asyncio.ensure_future(watcher.watch("agentd/job/drain/", before, 30))
    await asyncio.sleep(0.1)
    assert not watching.done()
    revision = await writer.set("agentd/job/drain/request", b"{}")
    assert (await asyncio.wait_for(watching, 10)).revision == revision > before
    # A write the watcher has not seen yet, made before its next watch, wakes it at once.
    await writer.set("agentd/job/drain/1/at_step", b"7")
    assert (await asyncio.wait_for(watcher.watch("", revision, 30), 5)).revision > revision


async def test_a_watch_without_a_write_returns_the_same_revision_at_its_timeout(stores):
    revision = await stores[0].revision()
    assert (await stores[0].watch("", revision, 0.2)).revision == revision


async def test_a_missing_or_deleted_key_reads_none_and_a_wait_times_out(stores):
    store = stores[0]
    await store.set("k", b"v")
    assert await store.get("k") == b"v" and await store.multi_get(["k", "nope"]) == [b"v", None]
    assert await store.delete("k") and await store.get("k") is None
    with pytest.raises(StoreTimeout):
        await store.wait(["k"], 0.2)


async def test_a_watch_never_delays_a_request_of_the_same_agent(server, stores):
    """...and one connection is kept after them: node 0's store serves every agent and
    worker of the job, within a bound on its connections."""
    store = stores[0]
    watching = asyncio.ensure_future(store.watch("", await store.revision(), 30))
    async with asyncio.timeout(10):
        while store._idle:  # the watch has taken the connection the revision left idle
            await asyncio.sleep(0.01)
    await asyncio.wait_for(store.set("report", b"3"), 2)  # its own connection
    await asyncio.wait_for(watching, 5)
    async with asyncio.timeout(10):
        while len(server._connections) != 1:
            await asyncio.sleep(0.01)


async def test_a_store_gone_is_unavailable_and_one_served_again_is_reached(server, stores):
    store = stores[0]
    await store.set("k", b"v")
    port = server.port
    await server.stop()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        await store.get("k")
    again = TCPStoreServer("127.0.0.1", port)  # node 0's agent started again
    await again.start()
    try:
        assert await store.get("k") is None  # a new, empty store
        assert await store.revision() == 0
    finally:
        await again.stop()


async def test_two_nodes_agree_on_a_step_and_the_round_clears_the_drain(server, stores):
    """The whole protocol between two nodes over one TCPStore; node 0's clear at the next
    round removes the drain's keys but keeps the revision counting up."""
    ranks = ["0", "1"]

    async def members() -> list[str]:
        return ranks

    zero, one = (
        Drains(lambda s=s: s, RunKeys("job"), rank, members)
        for s, rank in zip(stores, ranks, strict=True)
    )
    request, joined = await one.request("maintenance", 60)
    assert not joined
    assert (await zero.current())[0] == request
    for drains, step in ((zero, 41), (one, 40)):
        await drains.told(request.id, 0.25)
        await drains.report_step(request.id, step)
    chosen, missing = await one.choose_step(request.id, told_within=5, grace=1, settle=1)
    assert (chosen, missing) == (42, [])
    assert await zero.current() == (request, 42)
    for drains in (zero, one):
        await drains.acknowledge(request.id, {"ranks": 1, "steps": [42]})
    assert set(await one.acknowledgements(request.id, 5)) == {"0", "1"}

    revision = await stores[0].revision()
    server.clear_except("/agentd/static/")  # node 0, as the next round starts
    assert await zero.current() == (None, None)
    assert await stores[0].revision() == revision
    client = await TCPStoreClient.connect("127.0.0.1", server.port, 5)
    assert (await client.multi_get([COUNTER]))[0] == str(revision).encode()
    await client.close()


async def test_a_second_request_joins_the_first_in_node_0s_store(stores):
    async def members() -> list[str]:
        return ["0", "1"]

    zero, one = (
        Drains(lambda s=s: s, RunKeys("job"), r, members) for s, r in zip(stores, "01", strict=True)
    )
    first, joined_first = await zero.request("SIGUSR1", 60)
    second, joined = await one.request("SIGUSR1", 60)
    assert (joined_first, second, joined) == (False, first, True)
    assert await zero.leaving(first.id) == {"0", "1"}
