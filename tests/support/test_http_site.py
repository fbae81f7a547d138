"""Every listener is bounded: connections, time to send a request, time to send a body."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentd.health.server import HealthCheckServer
from agentd.store.candidacy import Candidacy
from agentd.store.server import StoreServer
from agentd.support.http_site import Limits
from tests.conftest import free_port


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a new connection; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


GET_LIVEZ = b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture
async def health():
    server = HealthCheckServer(lambda: True, 0, 5.0, max_connections=3)
    await server.start_async()
    yield server
    await server.stop_async()


async def test_connections_beyond_the_cap_get_503_and_room_comes_back(health, caplog):
    held = [await asyncio.open_connection("127.0.0.1", health.port) for _ in range(3)]
    await asyncio.sleep(0.05)  # accepted
    for _ in range(20):
        answer = await exchange(health.port, GET_LIVEZ)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"too many connections (3)" in body
    assert json.loads(body)["error"].startswith("health_port: too many connections")
    assert len([r for r in caplog.records if "refusing new ones" in r.getMessage()]) == 1
    for _, writer in held:
        writer.close()
    async with asyncio.timeout(5):
        while not (await exchange(health.port, GET_LIVEZ)).startswith(b"HTTP/1.1 200 "):
            await asyncio.sleep(0.01)


async def test_a_connection_that_never_sends_a_request_is_closed():
    server = HealthCheckServer(lambda: True, 0, 5.0)
    server._limits = Limits(max_connections=8, idle_timeout=0.3)
    await server.start_async()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /livez HTTP/1.1\r\nHost:")  # a slowloris: never finishes
        await writer.drain()
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server
        writer.close()
    finally:
        await server.stop_async()


async def test_a_store_request_whose_body_never_arrives_gets_408():
    server = StoreServer(limits=Limits(max_connections=8, idle_timeout=5, body_timeout=0.3))
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        auth = f"Authorization: Bearer {server.token}\r\n".encode()
        writer.write(
            b"POST /v1/get HTTP/1.1\r\nHost: x\r\n" + auth + b'Content-Length: 100\r\n\r\n{"key"'
        )
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
            assert b"not received within 0.3s" in await reader.readuntil(b"}")
            assert await reader.read() == b""  # closed, after a short linger
        writer.close()
    finally:
        await server.stop()


LONG_POLLS = {
    "watch": b'{"prefix": "", "after_revision": 0, "timeout": 60}',
    "wait": b'{"keys": ["never"], "timeout": 60}',
}


@pytest.mark.parametrize("candidate", [False, True], ids=["plain", "candidate"])
@pytest.mark.parametrize("op", sorted(LONG_POLLS))
async def test_an_abandoned_long_poll_is_cancelled(op, candidate):
    """Also on a store served by a candidate (every job of several nodes): its long polls
    run beside a watch for a step-down, and used to outlive their client by up to 60 s."""
    candidacy = None
    if candidate:
        port = free_port()
        candidacy = Candidacy((f"127.0.0.1:{port}",), 0, "t" * 16, growing=True)
        server = StoreServer("127.0.0.1", port, "t" * 16, candidacy=candidacy)
    else:
        server = StoreServer()
    await server.start()
    if candidacy is not None:
        candidacy.promote(1)
    try:
        body = LONG_POLLS[op]
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        auth = f"Authorization: Bearer {server.token}\r\n".encode()
        writer.write(
            f"POST /v1/{op} HTTP/1.1\r\nHost: x\r\n".encode()
            + auth
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        await writer.drain()
        async with asyncio.timeout(5):
            while not server.store.waiting:  # the long poll is waiting
                await asyncio.sleep(0.01)
        writer.close()
        async with asyncio.timeout(5):
            while server.store.waiting:  # and is gone with its client
                await asyncio.sleep(0.01)
    finally:
        await server.stop()


async def test_malformed_requests_are_counted_in_one_warning_line_per_interval(caplog):
    server = StoreServer(limits=Limits(log_interval=0.0))
    await server.start()
    try:
        for _ in range(3):
            answer = await exchange(server.port, b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 Bad Request")
    finally:
        await server.stop()
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert [line.split(" so far")[0] for line in lines] == [
        f"store: answered 400 to {n} malformed request(s)" for n in (1, 2, 3)
    ]
    assert all(r.exc_info is None and r.levelname == "WARNING" for r in caplog.records)
    assert server.server_log.malformed == 3


async def test_a_compressed_body_is_refused_not_an_internal_error(caplog):
    server = StoreServer()
    await server.start()
    try:
        auth = f"Authorization: Bearer {server.token}\r\n".encode()
        answer = await exchange(
            server.port,
            b"POST /v1/get HTTP/1.1\r\nHost: x\r\n"
            + auth
            + b"Content-Encoding: gzip\r\nContent-Length: 5\r\n"
            + b"Connection: close\r\n\r\nabcde",
        )
    finally:
        await server.stop()
    assert answer.startswith(b"HTTP/1.1 400 ") and b"Content-Encoding: 'gzip'" in answer
    assert [r.levelname for r in caplog.records if r.levelno >= 30] == ["WARNING"]
    assert server.server_log.malformed == 1
