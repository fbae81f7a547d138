"""The agent's TCPStore client against agentd's server and against torch's own (a
behaviour torch's server lacks fails here), and beside torch's client, which prefixes its
keys with ``/``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from agentd.tcpstore.client import TCPStoreClient
from agentd.tcpstore.server import TCPStoreServer
from tests.conftest import free_port
from tests.helpers.torch_store import torch_master_store


@pytest.fixture(params=["agentd", "torch"])
async def port(request) -> AsyncIterator[int]:
    if request.param == "torch":
        pytest.importorskip("torch.distributed")
        master = torch_master_store()
        yield master.port
        del master
    else:
        server = TCPStoreServer("127.0.0.1", 0)
        await server.start()
        yield server.port
        await server.stop()


async def test_each_request(port):
    store = await TCPStoreClient.connect("127.0.0.1", port, 10)
    await store.set("/k", b"v")
    assert await store.multi_get(["/k", "/missing"]) == [b"v", b""]
    assert await store.add("/n", 5) == 5 and await store.add("/n", -2) == 3
    assert await store.compare_set("/claim", b"", b"mine") == b"mine"
    assert await store.compare_set("/claim", b"", b"theirs") == b"mine"
    assert await store.compare_set("/claim", b"mine", b"next") == b"next"
    assert await store.check(["/k", "/n"]) and not await store.check(["/k", "/nope"])
    assert await store.wait(["/k", "/n"], 5)
    assert await store.delete("/k") and not await store.delete("/k")
    assert not await store.check(["/k"])
    await store.close()


async def test_a_wait_that_times_out_leaves_the_connection_usable(port):
    store = await TCPStoreClient.connect("127.0.0.1", port, 10)
    assert not await store.wait(["/never"], 0.2)
    await store.set("/after", b"1")
    assert await store.multi_get(["/after"]) == [b"1"]
    await store.close()


async def test_a_wait_ends_when_another_client_sets_the_key(port):
    waiter = await TCPStoreClient.connect("127.0.0.1", port, 10)
    setter = await TCPStoreClient.connect("127.0.0.1", port, 10)
    waiting = asyncio.ensure_future(waiter.wait(["/late"], 30))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await setter.set("/late", b"1")
    assert await asyncio.wait_for(waiting, 10)
    for store in (waiter, setter):
        await store.close()


async def test_torchs_client_sees_the_keys_under_its_slash():
    dist = pytest.importorskip("torch.distributed")
    server = TCPStoreServer("127.0.0.1", 0)
    await server.start()
    store = await TCPStoreClient.connect("127.0.0.1", server.port, 10)
    await store.set("/agentd/x", b"1")
    theirs = await asyncio.to_thread(  # it blocks: our server runs on this loop
        dist.TCPStore, "127.0.0.1", server.port, None, False, timedelta(seconds=10)
    )
    assert await asyncio.to_thread(theirs.get, "agentd/x") == b"1"
    await asyncio.to_thread(theirs.set, "from_torch", "2")
    assert await store.multi_get(["/from_torch"]) == [b"2"]
    del theirs
    await store.close()
    await server.stop()


async def test_connect_waits_for_a_server_that_starts_late():
    port = free_port()
    server = TCPStoreServer("127.0.0.1", port)
    connecting = asyncio.ensure_future(TCPStoreClient.connect("127.0.0.1", port, 30))
    await asyncio.sleep(0.3)
    assert not connecting.done()
    await server.start()
    store = await asyncio.wait_for(connecting, 10)
    await store.set("/k", b"v")
    assert await store.multi_get(["/k"]) == [b"v"]
    await store.close()
    await server.stop()


async def test_connect_gives_up_after_its_time_naming_the_address():
    port = free_port()
    with pytest.raises(TimeoutError, match=rf"no store at 127.0.0.1:{port} within 0s"):
        await TCPStoreClient.connect("127.0.0.1", port, 0.3)


async def test_a_store_that_goes_away_is_a_connection_error_for_good():
    server = TCPStoreServer("127.0.0.1", 0)
    await server.start()
    store = await TCPStoreClient.connect("127.0.0.1", server.port, 10)
    waiting = asyncio.ensure_future(store.wait(["/never"]))
    await asyncio.sleep(0.1)
    await server.stop()
    with pytest.raises(ConnectionError, match="closed the connection"):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(ConnectionError, match="is closed"):
        await store.set("/k", b"v")


async def test_a_close_cancelled_half_way_leaves_the_client_closable(port):
    """A request abandoned as its connection broke closes the client in its own task; that
    task cancelled in the close (``first_of`` cancels its waits when one fails) once left
    the connection's close future cancelled, and the owner's close then raised
    CancelledError: a static node crashed in its exit barrier as node 0's store went."""
    store = await TCPStoreClient.connect("127.0.0.1", port, 10)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # suspended in the close's wait
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await asyncio.wait_for(store.close(), 10)
    with pytest.raises(ConnectionError, match="is closed"):
        await store.set("/k", b"v")
