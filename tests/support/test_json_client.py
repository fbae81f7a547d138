"""The lean JSON HTTP client over real sockets: keep-alive reuse, concurrent requests, and
each failure saying whether the request may have reached the server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import pytest

from agentd.support.http_messages import Request
from agentd.support.http_site import Limits, ServerLog
from agentd.support.json_client import JsonClient, MaybeSent, NotSent
from agentd.support.json_http import JsonHttpServer
from tests.conftest import free_port


async def answer(request: Request) -> tuple[int, bytes, dict[str, str]]:
    if request.path == "/slow":
        await asyncio.sleep(60)
    doc = {"path": request.path, "body": json.loads(request.body), "peer": request.peer}
    return 200, json.dumps(doc).encode(), {"X-Token": request.headers.get("authorization", "")}


@pytest.fixture
async def server():
    limits = Limits(max_connections=16, idle_timeout=5.0, body_timeout=5.0)
    served = JsonHttpServer(answer, "test", limits, ServerLog("test"), max_body=1 << 20)
    port = await served.start("127.0.0.1", 0, None)
    yield served, port
    await served.stop()


async def test_requests_reuse_an_idle_connection_and_run_concurrently_on_others(server):
    served, port = server
    client = JsonClient("127.0.0.1", port)
    try:
        for n in range(3):
            reply = await client.post("/a", b'{"n": %d}' % n, {"Authorization": "t"}, 5, 5)
            assert reply.status == 200 and json.loads(reply.body)["body"] == {"n": n}
            assert reply.headers["x-token"] == "t"
        assert len(served.connections) == 1
        big = json.dumps({"v": "x" * 200_000}).encode()  # larger than a socket buffer
        replies = await asyncio.gather(*(client.post("/b", big, {}, 5, 5) for _ in range(4)))
        assert all(json.loads(r.body)["body"]["v"] == "x" * 200_000 for r in replies)
        assert len(served.connections) == 4
        sock = next(iter(client._open))._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # no Nagle delays
    finally:
        client.close()


async def test_a_refused_connection_is_not_sent():
    client = JsonClient("127.0.0.1", free_port())
    with pytest.raises(NotSent) as caught:
        await client.post("/a", b"{}", {}, 5, 5)
    assert caught.value.refused


async def test_a_connection_to_itself_is_refused_and_frees_the_port():
    """A client retrying a port nobody listens on yet (a store's host still starting) can
    be given that port as its own ephemeral one, and TCP then connects it to itself: it
    would read its own request as the answer, and the host could not bind the port. Here
    the client is bound to the port it connects to, as that would happen."""
    port = free_port()

    def on_the_port(info):
        sock = socket.socket(info[0], info[1], info[2])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return sock

    client = JsonClient("127.0.0.1", port, socket_factory=on_the_port)
    with pytest.raises(NotSent) as caught:
        await client.post("/a", b"{}", {}, 5, 5)
    assert caught.value.refused and "connected to itself" in str(caught.value)
    limits = Limits(max_connections=16, idle_timeout=5.0, body_timeout=5.0)
    served = JsonHttpServer(answer, "test", limits, ServerLog("test"), max_body=1 << 20)
    assert await served.start("127.0.0.1", port, None) == port  # the port is free again
    try:
        reply = await JsonClient("127.0.0.1", port).post("/a", b"{}", {}, 5, 5)
        assert reply.status == 200
    finally:
        await served.stop()


async def test_no_answer_in_time_may_have_been_sent_and_frees_the_server(server):
    served, port = server
    client = JsonClient("127.0.0.1", port)
    with pytest.raises(MaybeSent, match=r"no answer within 0\.2s"):
        await client.post("/slow", b"{}", {}, 0.2, 5)
    async with asyncio.timeout(5):  # the connection closed: the server's handler ends too
        while served.connections:
            await asyncio.sleep(0.01)
    client.close()
    with pytest.raises(NotSent, match="closed"):
        await client.post("/a", b"{}", {}, 5, 5)


async def raw_server(reply: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reply(writer)
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def post_to(reply: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> bytes:
    server = await raw_server(reply)
    client = JsonClient("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        return (await client.post("/a", b"{}", {}, 5, 5)).body
    finally:
        client.close()
        server.close()


async def test_an_answer_without_a_length_ends_at_the_close():
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"all": ')
        await writer.drain()
        writer.write(b"true}")

    assert await post_to(reply) == b'{"all": true}'


@pytest.mark.parametrize(
    ("answer_bytes", "message"),
    [
        (b"", "the server closed the connection"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "the answer is not HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "the server closed"),
    ],
)
async def test_a_broken_answer_may_have_been_sent(answer_bytes, message):
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(answer_bytes)
        await writer.drain()

    with pytest.raises(MaybeSent, match=message):
        await post_to(reply)


async def test_without_keepalive_each_connection_closes_after_its_answer(server):
    served, port = server
    client = JsonClient("127.0.0.1", port, keepalive=0)
    try:
        for _ in range(3):
            assert (await client.post("/a", b"{}", {}, 5, 5)).status == 200
            async with asyncio.timeout(5):  # closed by the client: the server sees it go
                while served.connections:
                    await asyncio.sleep(0.01)
    finally:
        client.close()


async def test_a_connection_idle_past_the_keepalive_is_closed_not_reused(server):
    served, port = server
    client = JsonClient("127.0.0.1", port, keepalive=0.2)
    try:
        await asyncio.gather(*(client.post("/a", b"{}", {}, 5, 5) for _ in range(2)))
        assert len(served.connections) == 2
        await asyncio.sleep(0.3)  # both idle past the keep-alive
        await client.post("/a", b"{}", {}, 5, 5)  # on a new connection; the old ones close
        async with asyncio.timeout(5):
            while len(served.connections) != 1:
                await asyncio.sleep(0.01)
    finally:
        client.close()


async def test_a_tls_connect_cancelled_after_its_handshake_leaves_no_descriptor_behind(
    tmp_path, monkeypatch
):
    """A connect cancelled between the TLS handshake's end and the caller's next step (a
    request cancelled, or its connect timeout, at that moment) leaves asyncio closing the
    connection gracefully, its socket still its own: a client that closed that socket
    itself freed the descriptor under a live transport, and the next connection, given
    the same number, failed with "File descriptor N is used by transport" (an agent's
    exit barrier over TLS, in the suite, 2026-11-29)."""
    from agentd.store.tls import StoreTls
    from agentd.support import json_client
    from tests.helpers.tls import make_ca, node_tls

    node = node_tls(tmp_path, "n0", make_ca(tmp_path))
    tls = StoreTls(str(node.ca), str(node.cert), str(node.key))
    limits = Limits(max_connections=16, idle_timeout=5.0, body_timeout=5.0)
    served = JsonHttpServer(answer, "test", limits, ServerLog("test"), max_body=1 << 20)
    port = await served.start("127.0.0.1", 0, tls.server_context(lambda why: None))
    poster: asyncio.Task[object] | None = None
    made = json_client._Connection.connection_made

    def cancelled_once_made(connection, transport):  # the handshake's end, before its waiter
        made(connection, transport)
        if poster is not None and not poster.done():
            poster.cancel()

    monkeypatch.setattr(json_client._Connection, "connection_made", cancelled_once_made)
    client = JsonClient("127.0.0.1", port, tls.client)
    loop = asyncio.get_running_loop()
    try:
        poster = asyncio.create_task(client.post("/a", b"{}", {}, 5, 5))
        with pytest.raises(asyncio.CancelledError):
            await poster
        monkeypatch.setattr(json_client._Connection, "connection_made", made)
        # the next socket takes the lowest free descriptor: the freed one, were it freed
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
        finally:
            sock.close()
        reply = await client.post("/b", b"{}", {}, 5, 5)
        assert reply.status == 200
    finally:
        client.close()
        await served.stop()
