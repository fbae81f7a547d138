"""Candidate stores and their client, over real HTTP on loopback addresses: who serves,
who steps down, what a client does when its server goes, and what it costs when nothing
fails."""

from __future__ import annotations

import asyncio
import gc
import io
import json

import aiohttp
import pytest

from agentd.exceptions import ConfigError
from agentd.store.api import StoreLeft, StoreUnavailable
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import CandidateMismatch, fingerprint, parse_candidates
from agentd.store.failover import FailoverStore
from agentd.store.http_client import HttpStore
from agentd.store.server import StoreServer
from agentd.store.wire import CANDIDATES_HEADER, TERM_HEADER
from tests.conftest import free_port

TOKEN = "secret"


class Candidates:
    """Candidate servers on 127.0.0.1, .2, ... at one port; each can be stopped and restarted."""

    def __init__(self, count: int) -> None:
        self.port = free_port()
        self.endpoints = [f"127.0.0.{i + 1}:{self.port}" for i in range(count)]
        self.servers: list[StoreServer | None] = [None] * count
        self.clients: list[FailoverStore] = []

    async def start(self, index: int) -> StoreServer:
        server = StoreServer(
            f"127.0.0.{index + 1}",
            self.port,
            TOKEN,
            candidacy=Candidacy(self.endpoints, index, TOKEN),
        )
        await server.start()
        self.servers[index] = server
        return server

    async def stop(self, index: int) -> None:
        server, self.servers[index] = self.servers[index], None
        if server is not None:
            await server.stop()

    def client(self, endpoints: list[str] | None = None, retry: float = 5.0) -> FailoverStore:
        client = FailoverStore(
            endpoints or self.endpoints, TOKEN, retry_timeout=retry, request_timeout=2.0
        )
        self.clients.append(client)
        return client

    def role(self, index: int) -> tuple[str, int]:
        server = self.servers[index]
        assert server is not None and server.candidacy is not None
        return server.candidacy.role, server.candidacy.term

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for index in range(len(self.servers)):
            await self.stop(index)


async def post(endpoint: str, op: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {TOKEN}", **headers}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{endpoint}/v1/{op}", data=io.BytesIO(body), headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_the_lowest_candidate_is_promoted_and_every_client_meets_there(three):
    first, second = three.client(), three.client()
    await first.set("k", b"v")
    assert await second.get("k") == b"v"
    roles = [three.role(i) for i in range(3)]
    assert [role for role, _ in roles] == ["serving", "standby", "standby"]
    assert roles[0][1] == 1 and max(term for _, term in roles) == 1  # its asks carry term 1
    assert first.status()["serving"] == three.endpoints[0]
    assert first.status()["failed"] == {}


async def test_a_standby_refuses_store_operations_with_421(three):
    await three.client().set("k", b"v")
    status, doc = await post(three.endpoints[1], "get", b'{"key": "k"}', {})
    assert status == 421 and "stands by" in doc["error"]


async def test_the_server_lost_moves_every_client_to_the_next_candidate(three):
    client, watcher = three.client(), three.client()
    await client.set("k", b"v")
    assert client.incarnation == 0  # finding the first server replaces nothing
    revision = await watcher.revision()
    watch = asyncio.create_task(watcher.watch("", revision, 30))
    await asyncio.sleep(0.1)
    await three.stop(0)
    result = await asyncio.wait_for(watch, 10)
    assert result.compacted  # the new store's revisions are not the old one's
    assert await client.get("k") is None  # the state starts empty there
    assert client.incarnation == watcher.incarnation == 1  # what the rounds compare
    assert three.role(1) == ("serving", 2)
    status = client.status()
    assert (status["serving"], status["term"], status["failovers"]) == (three.endpoints[1], 2, 1)
    assert three.endpoints[0] in status["failed"]


async def test_a_restarted_candidate_stands_by_and_takes_nothing_back(three):
    client = three.client()
    await client.set("k", b"v")
    await three.stop(0)
    await client.set("k", b"w")
    await three.start(0)
    newcomer = three.client()
    assert await newcomer.get("k") == b"w"  # the newest term serves, not the lowest index
    assert three.role(0) == ("standby", 0)


async def test_a_server_shown_a_newer_term_steps_down_and_ends_its_long_polls(three):
    client = three.client()
    await client.set("k", b"v")
    stale = HttpStore(three.endpoints[0], TOKEN)
    waiting = asyncio.create_task(stale.wait(["never"], 30))
    await asyncio.sleep(0.1)
    status, _ = await post(three.endpoints[0], "get", b'{"key": "k"}', {TERM_HEADER: "5"})
    assert status == 421
    with pytest.raises(Exception, match="stands by"):
        await asyncio.wait_for(waiting, 5)
    assert three.role(0) == ("standby", 5)
    await stale.close()
    assert await client.get("k") is None  # moved to a new server, under a newer term
    assert client.term > 5


async def test_a_serving_candidate_that_finds_a_newer_term_steps_down(three):
    """Two servers at once (a partition healed): the one under the older term goes, as
    soon as it has a sign it may have been cut off (here, a heartbeat key expiring)."""
    old, new = three.client(), three.client()
    await old.set("beat", b"1", ttl=0.2)
    assert three.role(0) == ("serving", 1)
    three.servers[1].candidacy.promote(2)  # as a client cut off from candidate 0 would
    for _ in range(50):  # the heartbeat expires: candidate 0 looks for a successor
        if three.role(0)[0] == "standby":
            break
        await asyncio.sleep(0.1)
    assert three.role(0) == ("standby", 2)
    await new.set("k", b"v")
    assert await old.get("k") == b"v"  # both clients end up on the newest server


async def test_nothing_is_asked_beyond_the_requests_while_nothing_fails(three):
    client = three.client()
    await client.set("k", b"v")  # finding the server: one probe of each candidate
    sent = client.requests
    for _ in range(20):
        await client.refresh("k", 5)
    assert client.requests == sent + 20
    terms = [three.servers[i].candidacy.term for i in range(3)]
    assert terms[0] == 1 and max(terms) == 1  # nobody was promoted again


async def test_no_candidate_answering_is_one_error_naming_each(three):
    client = three.client(retry=1.0)
    await client.set("k", b"v")
    for index in range(3):
        await three.stop(index)
    with pytest.raises(StoreUnavailable, match="no store candidate serves") as caught:
        await client.get("k")
    assert all(endpoint in str(caught.value) for endpoint in three.endpoints)


async def test_a_client_that_leaves_gives_up_at_once_when_no_candidate_answers(three):
    """Leaving (a job stopped whole), a search that finds no candidate answering ends at
    once: their agents have left too. Before, it tried for its retry timeout (30 s)."""
    client = three.client(retry=600.0)
    await client.set("k", b"v")
    for index in range(3):
        await three.stop(index)
    client.leave()
    async with asyncio.timeout(60):  # the retry timeout would be 600 s
        with pytest.raises(StoreLeft, match="no store candidate answers") as caught:
            await client.get("k")
    assert all(endpoint in str(caught.value) for endpoint in three.endpoints)


async def test_a_client_that_leaves_still_moves_to_a_candidate_that_answers(three):
    client = three.client()
    await client.set("k", b"v")
    client.leave()
    await three.stop(0)
    await client.set("k", b"w")  # candidate 1, promoted: the leave goes on there
    assert client.serving == 1


async def test_a_list_in_another_order_is_refused_naming_both(three, caplog):
    with pytest.raises(CandidateMismatch, match="another list \\(or order\\)"):
        await three.client(list(reversed(three.endpoints))).get("k")
    gc.collect()  # every candidate refused: one error raised, the others read, none left
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    status, doc = await post(three.endpoints[0], "role", b"", {CANDIDATES_HEADER: "0" * 16})
    assert status == 409 and ",".join(three.endpoints) in doc["error"]


async def test_a_client_waits_a_little_for_lower_candidates_to_start():
    group = Candidates(2)
    try:
        await group.start(1)
        client = group.client()
        setting = asyncio.create_task(client.set("k", b"v"))
        await asyncio.sleep(0.5)
        await group.start(0)  # the primary arrives within the grace period: it serves
        await asyncio.wait_for(setting, 10)
        assert group.role(0) == ("serving", 1) and group.role(1) == ("standby", 0)
    finally:
        await group.close()


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        ({TERM_HEADER: "-1"}, b"{}", "Agentd-Store-Term: '-1' must be a non-negative integer"),
        ({}, b'{"term": "2"}', "term: '2' must be a 64-bit integer"),
        ({}, b"{not json", "body: not valid JSON"),
    ],
)
async def test_bad_candidate_requests_are_400_naming_the_field(three, headers, body, message):
    status, doc = await post(three.endpoints[1], "promote", body, headers)
    assert (status, doc["error"]) == (400, message)
    assert three.role(1) == ("standby", 0)


def test_candidate_lists_are_checked():
    assert parse_candidates("a:1, b:2") == (("a", 1), ("b", 2))
    for text, rule in (
        ("a:1,,b:2", "empty entry"),
        ("a:1,a:1", "twice"),
        ("a:0,b:1", "fixed port"),
    ):
        with pytest.raises(ConfigError, match=rule):
            parse_candidates(text)
    assert fingerprint(["a:1", "b:2"]) != fingerprint(["b:2", "a:1"])


def test_the_status_document_before_any_request():
    status = FailoverStore(["127.0.0.1:1", "127.0.0.2:1"], TOKEN).status()
    assert json.loads(json.dumps(status)) == {
        "endpoints": ["127.0.0.1:1", "127.0.0.2:1"],
        "growing": False,
        "serving": None,
        "term": 0,
        "failovers": 0,
        "failed": {},
        "peers": [],
        "tls": False,
        "list_term": 0,
    }


async def test_every_watch_from_before_a_move_answers_compacted_and_revisions_only_grow():
    """The agent watches several prefixes at once (its round, drains): each watch after
    a revision of the store it left must answer ``compacted``, not just the first one."""
    old, new = StoreServer("127.0.0.1", 0, TOKEN), StoreServer("127.0.0.1", 0, TOKEN)
    await old.start()
    await new.start()
    client = HttpStore(old.endpoint, TOKEN, retry_timeout=2.0)
    try:
        for i in range(5):
            seen = await client.set(f"k{i}", b"v")
        client.move_to(new.endpoint, lost_state=True)
        first, second = await asyncio.gather(
            client.watch("a/", seen, 5.0), client.watch("b/", seen, 5.0)
        )
        assert first.compacted and second.compacted
        after = await client.set("x", b"1")  # the new store's first write
        assert after > seen
        waiting = asyncio.create_task(client.watch("y", after, 5.0))
        await asyncio.sleep(0.05)
        await client.set("y", b"2")
        result = await waiting
        assert not result.compacted and [e.key for e in result.events] == ["y"]
        assert result.events[0].revision > after
    finally:
        await client.close()
        await old.stop()
        await new.stop()


def test_none_serving_names_every_candidate_and_why():
    from agentd.store.candidates import none_serving

    status = {
        "endpoints": ["127.0.0.1:1", "127.0.0.2:1"],
        "serving": None,
        "failed": {"127.0.0.1:1": "connection refused"},
    }
    assert none_serving(status) == (
        "no store candidate serves (127.0.0.1:1: connection refused; 127.0.0.2:1: no answer yet)"
    )
    assert none_serving({**status, "serving": "127.0.0.2:1"}) == ""
    searching = {**status, "serving": "127.0.0.1:1"}  # the one it used failed: it searches
    assert none_serving(searching) == none_serving(status)
    assert none_serving(None) == ""


async def test_a_serving_candidate_promoted_by_a_stale_report_keeps_its_term_and_state(three):
    """Two clients fail over at once: one asked the next candidate its role before the
    other promoted it, and asks it to serve under the next term. It serves on (seed 505 of
    ``bench/simulate.py --failover``); only a client that saw a newer term than its own
    makes it start again, empty."""
    client = three.client()
    await client.set("k", b"v")
    candidacy = three.servers[0].candidacy
    candidacy.promote(2)  # the client saw term 1, ours: its report of us was stale
    assert three.role(0) == ("serving", 1)
    assert await client.get("k") == b"v"
    candidacy.promote(3)  # a client that saw term 2: we were replaced meanwhile
    assert three.role(0) == ("serving", 3)
    assert await client.get("k") is None


async def test_a_client_that_reaches_no_candidate_but_its_own_promotes_none():
    """A member cut off from the others reaches only the candidate on its own host; were it
    to promote that one, it would form a job of its own beside theirs (S1; seed 545 of
    ``bench/simulate.py --failover``). Here candidate 0 accepts connections and never
    answers, as a frozen or cut-off host does."""
    import socket

    group = Candidates(2)
    silent = socket.socket()
    try:
        await group.start(0)
        await group.start(1)
        client = group.client(retry=2.0)
        client.own_candidate = group.endpoints[1]
        await client.set("k", b"v")
        await group.stop(0)
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", group.port))
        silent.listen()
        with pytest.raises(StoreUnavailable, match="no store candidate serves"):
            await client.get("k")
        assert group.role(1) == ("standby", 1)  # it learned the term, and serves nothing
    finally:
        silent.close()
        await group.close()
