"""The store server over real HTTP: auth, bad input, limits, retries, compaction."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import socket

import aiohttp
import pytest

from agentd.exceptions import ConfigError
from agentd.store.api import StoreAuthError, StoreFull, StoreUnavailable
from agentd.store.http_client import HttpStore
from agentd.store.memory import MemoryStore
from agentd.store.server import MAX_BODY, StoreServer


@pytest.fixture
async def server():
    srv = StoreServer("127.0.0.1", 0, token="right")
    await srv.start()
    yield srv
    await srv.stop()


async def post(url: str, data: bytes | str, token: str | None = "right") -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    payload = io.BytesIO(data.encode() if isinstance(data, str) else data)
    async with aiohttp.ClientSession() as http, http.post(url, data=payload, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_wrong_or_missing_token_is_401_and_changes_nothing(server):
    url = f"http://{server.endpoint}/v1/set"
    body = '{"key": "k", "value": "eA=="}'
    for token in (None, "wrong", ""):
        status, doc = await post(url, body, token)
        assert status == 401 and "bearer token" in doc["error"]
    assert await server.store.num_keys() == 0
    client = HttpStore(server.endpoint, token="wrong")
    with pytest.raises(StoreAuthError, match="refused our token"):
        await client.get("k")
    await client.close()


@pytest.mark.parametrize(
    ("op", "body", "status", "message"),
    [
        ("set", "{not json", 400, "body: not valid JSON"),
        ("set", "[1, 2]", 400, "body: must be a JSON object"),
        ("set", '{"key": "", "value": "eA=="}', 400, "key: '' must be a string of 1..1024"),
        ("set", '{"key": 5, "value": "eA=="}', 400, "key: 5 must be a string"),
        ("set", '{"key": "k", "value": "!!!"}', 400, "value: '!!!' is not valid base64"),
        ("set", '{"key": "k", "value": "eA==", "ttl": -1}', 400, "ttl: -1 must be a number"),
        ("add", '{"key": "k", "delta": "1"}', 400, "delta: '1' must be a 64-bit integer"),
        ("watch", '{"prefix": "", "after_revision": 0, "timeout": 999}', 400, "timeout: 999"),
        ("multi_get", '{"keys": "k"}', 400, "keys: must be a list"),
        (
            "compare_set",
            '{"key": "k", "desired": "eA==", "present": "hb/a"}',
            400,
            "present: must be a list of at most 32768 keys",
        ),
        (
            "compare_set",
            '{"key": "k", "desired": "eA==", "present": [""]}',
            400,
            "present: '' must be a string of 1..1024 bytes",
        ),
        (
            "compare_set",
            '{"key": "k", "desired": "eA==", "absent": {"hb/a": 1}}',
            400,
            "absent: must be a list of at most 32768 keys",
        ),
        ("frobnicate", "{}", 404, "op: 'frobnicate' is not one of"),
    ],
)
async def test_malformed_requests_get_4xx_json(server, op, body, status, message):
    code, doc = await post(f"http://{server.endpoint}/v1/{op}", body)
    assert code == status and message in doc["error"]
    assert await server.store.num_keys() == 0


async def test_oversized_body_and_value(server):
    code, doc = await post(
        f"http://{server.endpoint}/v1/set", '{"key": "k", "value": "' + "A" * (MAX_BODY + 8) + '"}'
    )
    assert code == 413 and "larger than" in doc["error"]
    big = base64.b64encode(bytes(2 << 20)).decode()  # 2 MiB: over the value limit
    code, doc = await post(f"http://{server.endpoint}/v1/set", f'{{"key": "k", "value": "{big}"}}')
    assert code == 400 and "bytes is more than" in doc["error"]
    assert await server.store.num_keys() == 0


async def test_other_methods_405(server):
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://{server.endpoint}/v1/get", headers={"Authorization": "Bearer right"}
        ) as r,
    ):
        assert r.status == 405


async def test_token_required_off_loopback():
    with pytest.raises(ConfigError, match="--store-token: required when the store binds"):
        StoreServer("0.0.0.0", 0)
    StoreServer("127.0.0.1", 0)  # loopback: allowed without a token
    StoreServer("::1", 0)


async def test_client_waits_for_a_store_that_starts_late():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpStore(f"127.0.0.1:{port}", retry_timeout=20)
    server = StoreServer("127.0.0.1", port)

    async def start_later() -> None:
        await asyncio.sleep(0.3)
        await server.start()

    starter = asyncio.ensure_future(start_later())
    try:
        assert await client.set("k", b"v") > 0  # retried until the server came up
        assert client.requests > 1
    finally:
        await starter
        await client.close()
        await server.stop()


async def test_unreachable_store_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpStore(f"127.0.0.1:{port}", retry_timeout=0.3)
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port} is unreachable after 0.3s"):
        await client.get("k")
    await client.close()
    assert StoreUnavailable.exit_code == 3


async def test_watch_from_a_compacted_revision_says_so():
    memory = MemoryStore(history=4)
    server = StoreServer(store=memory)
    await server.start()
    client = HttpStore(server.endpoint)
    try:
        for i in range(10):
            await client.set(f"k{i}", b"v")
        result = await client.watch("", 1, timeout=1)
        assert result.compacted and result.revision == 10
        assert not (await client.watch("", 8, timeout=1)).compacted
    finally:
        await client.close()
        await server.stop()


async def test_a_watch_across_a_store_restart_says_compacted():
    first = StoreServer("127.0.0.1", 0)
    await first.start()
    port = first.port
    client = HttpStore(f"127.0.0.1:{port}", retry_timeout=20)
    try:
        for i in range(5):
            await client.set(f"k{i}", b"old")
        seen = await client.revision()
        assert client.incarnation == 0
        await first.stop()
        second = StoreServer("127.0.0.1", port)  # a new store that soon passes our revision
        await second.start()
        try:
            for i in range(10):
                await second.store.set(f"n{i}", b"new")
            result = await client.watch("", seen, timeout=5)
            assert result.compacted and result.events == ()
            assert client.incarnation == 1  # a join that spans it starts again
        finally:
            await second.stop()
    finally:
        await client.close()


async def raw_request(port: int, op: str, body: bytes, auth: bytes = b"Bearer right") -> bytes:
    """One hand-written HTTP request (bytes no client library would send) and its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/"
        + op.encode()
        + b" HTTP/1.1\r\nHost: store\r\nAuthorization: "
        + auth
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


@pytest.mark.parametrize(
    ("op", "body", "auth", "status", "message"),
    [
        ("set", b"{}", b"Bearer \xff\xfe\xc3\xa9", 400, "Authorization: its value is not valid"),
        ("set", b"[" * 100_000 + b"]" * 100_000, b"Bearer right", 400, "nested too deeply"),
        ("set", b'{"key": "\\ud800", "value": ""}', b"Bearer right", 400, "lone surrogate"),
        ("multi_set", b'{"items": {"\\udfff": ""}}', b"Bearer right", 400, "lone surrogate"),
        (
            "watch",
            b'{"prefix": "\\udc00", "after_revision": 0, "timeout": 0}',
            b"Bearer right",
            400,
            "lone surrogate",
        ),
        (
            "wait",
            b'{"keys": ["k"], "timeout": 1' + b"0" * 400 + b"}",
            b"Bearer right",
            400,
            "must be a number within 0..60",
        ),
        (
            "add",
            b'{"key": "k", "delta": 1' + b"0" * 400 + b"}",
            b"Bearer right",
            400,
            "must be a 64-bit integer",
        ),
    ],
)
async def test_hostile_bytes_get_a_4xx_json_error_and_no_traceback(
    server, caplog, op, body, auth, status, message
):
    answer = await raw_request(server.port, op, body, auth)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert message in json.loads(payload)["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert await server.store.num_keys() == 0


async def test_the_history_is_bounded_by_bytes_and_old_watchers_read_compacted():
    memory = MemoryStore(history_bytes=4 << 20)
    for _ in range(50):
        await memory.set("big", b"x" * (1 << 20))
    assert memory._history_bytes <= 4 << 20 and len(memory._history) <= 4
    assert (await memory.watch("", 1, timeout=0)).compacted
    assert not (await memory.watch("", 49, timeout=0)).compacted


async def test_a_full_store_answers_507_and_keeps_what_it_had():
    server = StoreServer(store=MemoryStore(max_bytes=5 << 19))  # 2.5 MiB
    await server.start()
    client = HttpStore(server.endpoint)
    try:
        await client.set("a", b"x" * (1 << 20))
        await client.set("b", b"x" * (1 << 20))
        with pytest.raises(StoreFull, match="store is full"):
            await client.set("c", b"x" * (1 << 20))
        with pytest.raises(StoreFull):  # all or nothing
            await client.multi_set({"d": b"1", "e": b"x" * (1 << 20)})
        assert await client.multi_get(["c", "d", "e"]) == [None, None, None]
        await client.set("a", b"small")  # shrinking always works, and makes room
        await client.set("c", b"x" * (1 << 20))
        body = '{"key": "f", "value": "' + "eHh4" * 300_000 + '"}'  # 900 KB
        status, doc = await post(f"http://{server.endpoint}/v1/set", body, server.token)
        assert status == 507 and "store is full" in doc["error"]
    finally:
        await client.close()
        await server.stop()


async def test_a_watch_on_a_restarted_store_is_answered_at_once_even_past_its_revision():
    """The new store has already passed the revision the client knew, so revisions cannot
    tell: the watch names the server instance it belongs to."""
    first = StoreServer("127.0.0.1", 0)
    await first.start()
    port = first.port
    client = HttpStore(f"127.0.0.1:{port}", retry_timeout=20)
    try:
        await client.set("a", b"1")
        known = await client.revision()
        await first.stop()
        second = StoreServer("127.0.0.1", port)
        await second.start()
        for i in range(known + 5):  # the new store runs ahead of the old revision
            await second.store.set(f"other/{i}", b"x")
        client._restarted = False  # as if no response had told the client yet
        async with asyncio.timeout(5):  # not the 30 s the watch asks for
            result = await client.watch("a", known, timeout=30)
        assert result.compacted
    finally:
        await client.close()
        await second.stop()


async def test_a_client_closed_while_a_request_waits_to_retry_fails_it_cleanly():
    """A failover closes the old store's client while a watch retries on it: the watch
    gets StoreUnavailable (its caller tries the next store), never an AttributeError."""
    from tests.conftest import free_port

    client = HttpStore(f"127.0.0.1:{free_port()}", "t", retry_timeout=30.0, backoff_initial=0.2)
    request = asyncio.ensure_future(client.get("k"))
    async with asyncio.timeout(20):
        while client.requests < 1:  # refused once: now it waits to retry
            await asyncio.sleep(0.01)
    await client.close()
    with pytest.raises(StoreUnavailable, match="after the client was closed"):
        await asyncio.wait_for(request, 20)
