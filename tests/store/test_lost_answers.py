"""A request whose answer never reached the client: the connection closed under it (the
store's host handed the store over, or died) before or after the store applied it, which
the client cannot tell apart. Over real sockets: a relay on 127.0.0.1 closes the client's
connection instead of passing the request on, or passes it on and throws the answer
away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from agentd.store.api import StoreOutcomeUnknown
from agentd.store.http_client import HttpStore
from agentd.store.server import StoreServer
from tests.rendezvous.test_dynamic import handler, shutdown_all


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 message with a Content-Length (what the store and its client send)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


class AnswerDropper:
    """Relays HTTP connections to the store at ``port``; the next request for a path
    armed with :meth:`drop` gets no answer: its connection is closed, after the store
    answered it (``applied``) or before the store saw it."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._armed: str | None = None
        self._applied = True
        self.dropped: list[str] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def drop(self, path: str, applied: bool = True) -> None:
        self._armed, self._applied = path, applied

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        try:
            while True:
                request = await read_message(reader)
                path = request.split(b" ", 2)[1].decode()
                armed = path == self._armed
                if not armed or self._applied:
                    up_writer.write(request)
                    answer = await read_message(up_reader)
                if armed:
                    self._armed = None
                    self.dropped.append(path)
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            for each in (writer, up_writer):
                each.close()
                with contextlib.suppress(ConnectionError):
                    await each.wait_closed()


@pytest.fixture
async def relayed() -> AsyncIterator[tuple[StoreServer, AnswerDropper, HttpStore]]:
    server = StoreServer("127.0.0.1", 0, token="t")
    await server.start()
    relay = AnswerDropper(server.port)
    client = HttpStore(f"127.0.0.1:{await relay.start()}", token="t", retry_timeout=10)
    try:
        yield server, relay, client
    finally:
        await client.close()
        await relay.close()
        await server.stop()


@pytest.mark.parametrize("applied", [True, False])
async def test_a_count_once_whose_answer_was_lost_is_resent_and_counted_once(relayed, applied):
    """A member counted gone as the connection closed: resent, it is counted, once, and
    the caller learns so (it used to be a WARNING, the leave cut short, and a count that
    may be missing cost the others their last call)."""
    server, relay, client = relayed
    relay.drop("/v1/add_once", applied)
    assert await client.add_once("gone", "gone/a", b"left") == (True, 1)
    assert relay.dropped == ["/v1/add_once"]
    assert await server.store.multi_get(["gone", "gone/a"]) == [b"1", b"left"]


async def test_an_add_whose_answer_was_lost_is_not_resent(relayed):
    """``add`` (a round's arrival, whose count is its place) cannot be resent: the caller
    is told its outcome is unknown, and the store counted it once."""
    server, relay, client = relayed
    relay.drop("/v1/add")
    with pytest.raises(StoreOutcomeUnknown, match="not resent, it may have been applied"):
        await client.add("join", 1)
    assert await server.store.get("join") == b"1"


@pytest.mark.parametrize("applied", [True, False])
async def test_a_member_counted_gone_as_its_answer_is_lost_lets_the_others_seal_at_once(
    relayed, applied
):
    """Three nodes in one round; the one that leaves loses the answer to its gone count.
    Before, its leave stopped there (a WARNING), and where the store never saw the count
    the mark was placed but not counted, so the others' next round waited for the last
    call (60 s here). Now it is resent, the leave goes on, and the two left seal
    their next round as soon as both are back."""
    server, relay, leaver_client = relayed
    clients = [HttpStore(server.endpoint, token="t") for _ in range(2)]
    a, b = (handler(client, nodes=(2, 3), last_call_timeout=60.0) for client in clients)
    leaver = handler(leaver_client, nodes=(2, 3), last_call_timeout=60.0)
    try:
        first = [a.next_rendezvous(), b.next_rendezvous(), leaver.next_rendezvous()]
        infos = await asyncio.wait_for(asyncio.gather(*first), 20)
        assert {i.group_world_size for i in infos} == {3}
        relay.drop("/v1/add_once", applied)
        await asyncio.wait_for(leaver.shutdown(), 10)
        assert relay.dropped == ["/v1/add_once"]
        again = await asyncio.wait_for(asyncio.gather(a.next_rendezvous(), b.next_rendezvous()), 20)
        assert {(i.generation, i.group_world_size) for i in again} == {(1, 2)}
    finally:
        await shutdown_all(a, b, leaver)
        for client in clients:
            await client.close()
