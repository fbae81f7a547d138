"""The lean JSON HTTP server over real sockets: keep-alive, pipelining, every rule a
request can break answered with its status and a JSON error, and its connections'
limits."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from agentd.support.http_messages import MAX_HEAD, Request
from agentd.support.http_site import Limits, ServerLog
from agentd.support.json_http import JsonHttpServer


async def echo(request: Request) -> tuple[int, bytes, dict[str, str]]:
    if request.path == "/wait":
        await asyncio.sleep(60)
    doc = {"method": request.method, "path": request.path, "body": request.body.decode()}
    return 200, json.dumps(doc).encode(), {"X-Seen": request.headers.get("x-seen", "")}


async def serve(limits: Limits | None = None) -> tuple[JsonHttpServer, int]:
    limits = limits or Limits(max_connections=4, idle_timeout=5.0, body_timeout=5.0)
    server = JsonHttpServer(echo, "test", limits, ServerLog("test", 0.0), max_body=1000)
    return server, await server.start("127.0.0.1", 0, None)


@pytest.fixture
async def served():
    server, port = await serve()
    yield server, port
    await server.stop()


def request(body: bytes = b"{}", path: str = "/x", extra: bytes = b"") -> bytes:
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra
        + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


async def answers(port: int, data: bytes, count: int) -> list[tuple[bytes, dict]]:
    """Send ``data`` on one connection; the first ``count`` answers (head, JSON body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = []
    try:
        async with asyncio.timeout(10):
            for _ in range(count):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                got.append((head, json.loads(await reader.readexactly(length))))
    finally:
        writer.close()
    return got


async def test_requests_on_one_connection_are_answered_in_order(served):
    _, port = served
    pipelined = request(b'{"n": 1}', "/a") + request(b'{"n": 2}', "/b", b"X-Seen: yes\r\n")
    (head1, doc1), (head2, doc2) = await answers(port, pipelined, 2)
    assert head1.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" not in head1
    assert (doc1["path"], doc1["body"]) == ("/a", '{"n": 1}')
    assert (doc2["path"], b"X-Seen: yes" in head2) == ("/b", True)


async def test_http_1_0_and_connection_close_are_answered_then_closed(served):
    _, port = served
    for first_line, extra in ((b"HTTP/1.0", b""), (b"HTTP/1.1", b"Connection: close\r\n")):
        data = request(extra=extra).replace(b"HTTP/1.1", first_line, 1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        async with asyncio.timeout(10):
            answer = await reader.read()  # until the server closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close\r\n" in answer


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "Transfer"),
        (request(extra=b"Content-Encoding: gzip\r\n"), 400, "Content-Encoding: 'gzip'"),
        (b"POST /x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400, "Content-Length: '1e3'"),
        (b"POST /x HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", 413, "larger than 1000 bytes"),
        (request(extra=b"Content-Length: 2\r\n"), 400, "Content-Length: given twice"),
        (b"POST /x HTTP/2.0\r\n\r\n", 400, "is not HTTP/1.0 or HTTP/1.1"),
        (b"POST x HTTP/1.1\r\n\r\n", 400, "request line"),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "header X: its value holds a control"),
        (b"GET / HTTP/1.1\r\nX: \xff\xfe\r\n\r\n", 400, "header X: its value is not valid UTF-8"),
        (b"GET / HTTP/1.1\r\n folded\r\n\r\n", 400, "is not NAME: VALUE"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD, 400, f"longer than {MAX_HEAD} bytes"),
    ],
)
async def test_a_broken_rule_is_answered_with_its_status_and_counted(served, data, status, message):
    server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    async with asyncio.timeout(10):
        answer = await reader.read()  # answered, then closed
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert message in json.loads(body)["error"]
    assert server.server_log.malformed == (status == 400)


async def test_expect_100_continue_is_answered_before_the_body_comes(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        request(b"", extra=b"Expect: 100-continue\r\n").replace(b"Length: 0", b"Length: 2")
    )
    async with asyncio.timeout(10):
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"{}")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    writer.close()


async def test_connections_beyond_the_cap_get_503_and_a_waiting_handler_ends_with_its_client(
    served,
):
    server, port = served
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    held[0][1].write(request(path="/wait"))
    async with asyncio.timeout(10):
        while len(server.connections) < 4 or not any(c._task for c in server.connections):
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head
    assert "too many connections (4)" in json.loads(body)["error"]
    handler = next(c._task for c in server.connections if c._task)
    held[0][1].close()  # the waiting request's client goes: its handler is cancelled
    async with asyncio.timeout(10):
        while not handler.done():
            await asyncio.sleep(0.01)
    assert handler.cancelled() or handler.result() is None
    for _, w in held[1:]:
        w.close()


async def test_an_idle_connection_is_closed_after_the_idle_timeout():
    server, port = await serve(Limits(max_connections=4, idle_timeout=0.2, body_timeout=5.0))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nHost:")  # a slowloris
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        assert not server.connections
    finally:
        await server.stop()


async def test_a_request_waiting_unread_past_the_deadline_is_answered_not_closed(served):
    """A loop behind on a burst (or resuming from a stall) can reach a connection's idle
    deadline before it reads the request its client sent in time: that connection stays."""
    server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(10):
        while not server.connections:
            await asyncio.sleep(0.01)
        connection = next(iter(server.connections))
        connection._transport.pause_reading()  # the loop does not get to this socket
        writer.write(request(b'{"late": 1}'))
        while not connection._unread():
            await asyncio.sleep(0.01)
        connection._deadline = asyncio.get_running_loop().time() - 1  # past it
        connection._expired()
        assert not connection._transport.is_closing()
        connection._transport.resume_reading()
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    writer.close()


def connect_many(port: int, count: int) -> int:
    """Connect ``count`` times at once (the server's loop is not running meanwhile); how
    many the kernel took before one had to wait."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        pass
    finally:
        for sock in held:
            sock.close()
    return len(held)


async def test_a_burst_of_connections_waits_in_the_listen_queue(served):
    """A rendezvous's nodes connect at once, while the loop is busy: the kernel holds
    them (asyncio's own backlog of 128 dropped the rest's SYNs, a second's wait each)."""
    _, port = served
    assert connect_many(port, 600) == 600  # the loop is blocked: nothing is accepted
