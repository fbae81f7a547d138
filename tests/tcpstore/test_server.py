"""The workers' store against real torch clients (TCPStore(is_master=False), plain and
libuv), the way a training script's process group uses it; and the same assertions
against torch's own TCPStore server, so a behaviour that torch's server lacks fails here.

The server runs on a loop in a thread of this process (torch's client blocks).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from agentd.tcpstore.server import TCPStoreServer
from agentd.tcpstore.session import MAGIC
from agentd.tcpstore.table import StoreLimits
from tests.helpers.torch_store import torch_master_store

dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.torch


class ThreadedServer:
    """An agentd TCPStoreServer on its own event loop in a daemon thread."""

    def __init__(self, limits: StoreLimits | None = None, max_connections: int = 64) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = TCPStoreServer("127.0.0.1", 0, limits, max_connections=max_connections)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.port = self.server.port

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(params=["agentd", "torch"])
def server_port(request) -> Iterator[int]:
    if request.param == "torch":  # the reference: torch's own server
        master = torch_master_store()
        yield master.port
        del master
    else:
        server = ThreadedServer()
        yield server.port
        server.close()


def client(port: int, libuv: bool = True, seconds: float = 10):
    return dist.TCPStore(
        "127.0.0.1",
        port,
        world_size=None,
        is_master=False,
        use_libuv=libuv,
        timeout=timedelta(seconds=seconds),
        wait_for_workers=False,
    )


@pytest.mark.parametrize("libuv", [False, True])
def test_every_operation_of_a_torch_client(server_port, libuv):
    store = client(server_port, libuv)
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3
    assert store.get("n") == b"3"
    assert store.compare_set("k", "v", "w") == b"w"
    assert store.compare_set("k", "wrong", "x") == b"w"
    assert store.compare_set("new", "", "x") == b"x"
    assert store.check(["k", "n"]) and not store.check(["k", "nope"])
    store.wait(["k", "n"])
    with pytest.raises(Exception, match=r"(?i)timeout"):
        store.wait(["never"], timedelta(seconds=0.3))
    store.set("after", "1")  # the connection is still good after a cancelled wait
    assert store.get("after") == b"1"
    assert store.num_keys() >= 4
    assert store.delete_key("k") and not store.delete_key("k")
    store.append("log", "a")
    store.append("log", "b")
    assert store.get("log") == b"ab"
    store.multi_set(["x", "y"], ["1", "2"])
    assert store.multi_get(["x", "y", "log"]) == [b"1", b"2", b"ab"]
    if libuv:  # torch's plain client refuses queues on its own side
        store.queue_push("q", "first")
        store.queue_push("q", "second")
        assert store.queue_pop("q") == b"first" and store.queue_pop("q") == b"second"


def test_a_wait_is_woken_by_another_client(server_port):
    waiter, setter = client(server_port), client(server_port)
    threading.Timer(0.3, setter.set, ("late", "1")).start()
    began = time.monotonic()
    waiter.wait(["late"])
    assert 0.2 < time.monotonic() - began < 5


def test_a_prefix_store_as_init_process_group_uses_it(server_port):
    """What torch does with TORCHELASTIC_USE_AGENT_STORE=True: a client TCPStore with a
    world size (it counts itself in) behind a PrefixStore per attempt."""
    stores = [
        dist.PrefixStore(
            "/worker/attempt_0",
            dist.TCPStore("127.0.0.1", server_port, 3, False, timedelta(seconds=10)),
        )
        for _ in range(3)
    ]
    for rank, store in enumerate(stores):
        store.set(f"rank{rank}", str(rank))
    assert stores[0].get("rank2") == b"2"
    assert stores[2].add("counter", 1) in (1,)


def test_garbage_costs_only_its_own_connection():
    server = ThreadedServer(StoreLimits(max_key=1024))
    try:
        good = client(server.port)
        good.set("k", "v")
        for junk in (
            b"\x00\x00\x00\x00\x00",
            b"\x07" * 10,  # bad magic; no validation at all
            b"\x00" + MAGIC.to_bytes(4, "little") + b"\x63",  # an unknown command
            b"\x00" + MAGIC.to_bytes(4, "little") + b"\x01" + (1 << 40).to_bytes(8, "little"),
        ):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as bad:
                bad.sendall(junk)
                assert bad.recv(10) == b""  # closed by the server
        assert good.get("k") == b"v"  # and nobody else noticed
    finally:
        server.close()


def test_a_flood_of_requests_from_one_client_leaves_the_others_served():
    server = ThreadedServer(max_connections=16)
    try:
        flood = [client(server.port) for _ in range(8)]
        stop = threading.Event()

        def hammer(store) -> None:
            while not stop.is_set():
                store.add("flood", 1)

        threads = [threading.Thread(target=hammer, args=(s,)) for s in flood]
        for thread in threads:
            thread.start()
        try:
            other = client(server.port)
            began = time.monotonic()
            other.set("mine", "1")
            assert other.get("mine") == b"1"
            assert time.monotonic() - began < 5
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        extra = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        try:  # beyond the cap, new connections are closed at once
            assert any(sock.recv(1) == b"" for sock in extra[-8:])
        finally:
            for sock in extra:
                sock.close()
    finally:
        server.close()
