"""A serving candidate hands its store, state and all, to a successor it picks
(agentd/store/succession.py): real servers on 127.0.0.1-3, real clients."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from agentd.store.succession import hand_down
from agentd.store.wire import TERM_HEADER
from tests.store.test_failover import post


async def test_a_store_handed_down_keeps_its_keys_and_every_client_follows(three, caplog):
    client, watcher = three.client(), three.client()
    await client.set("ctl/gen", b"7")
    await client.set("ctl/hb/a", b"1", ttl=1.5)
    revision = await watcher.revision()
    watch = asyncio.create_task(watcher.watch("", revision, 30))
    await asyncio.sleep(0.1)
    with caplog.at_level(logging.INFO):
        # the candidate preferred first takes it, not the lowest index
        assert (
            await hand_down(three.servers[0], [three.endpoints[2], three.endpoints[1]])
            == (three.endpoints[2])
        )
        assert three.role(0) == ("standby", 2) and three.role(2) == ("serving", 2)
        assert three.role(1)[0] == "standby"
        assert (await asyncio.wait_for(watch, 10)).compacted  # read again, at the successor
        assert await client.multi_get(["ctl/gen", "ctl/hb/a"]) == [b"7", b"1"]
    status = client.status()
    assert (status["serving"], status["term"], status["failovers"]) == (three.endpoints[2], 2, 1)
    # a planned move, said as one: not a failover
    moved = f"Store moved: {three.endpoints[0]} handed the store, state and all, to "
    assert moved + three.endpoints[2] in caplog.text
    assert "Store failover" not in caplog.text and "stepping down" not in caplog.text
    # the TTL key lives on for the seconds it had left, and no longer
    async with asyncio.timeout(10):
        while await client.get("ctl/hb/a") is not None:
            await asyncio.sleep(0.05)
    assert await client.get("ctl/gen") == b"7"


async def test_writes_sent_during_a_hand_down_are_each_counted_once(three):
    """Every ``add`` sent while the state is handed over is applied before the snapshot,
    or held and refused, then sent again at the successor: none is lost."""
    clients = [three.client() for _ in range(4)]
    await clients[0].set("counter", b"0")
    adds = [asyncio.ensure_future(c.add("counter", 1)) for c in clients for _ in range(25)]
    assert await hand_down(three.servers[0], [three.endpoints[1]]) == three.endpoints[1]
    await asyncio.wait_for(asyncio.gather(*adds), 30)
    assert await clients[0].get("counter") == b"100"
    assert three.role(1) == ("serving", 2)


async def test_a_candidate_that_cannot_take_the_store_leaves_it_serving_here(three):
    client = three.client()
    await client.set("k", b"v")
    await three.stop(2)  # nothing listens there
    # candidate 1 has seen a newer term than the one it would be handed the store under
    status, _ = await post(three.endpoints[1], "role", b"{}", {TERM_HEADER: "5"})
    assert status == 200
    assert await hand_down(three.servers[0], three.endpoints[1:]) == ""
    assert three.role(0) == ("serving", 1) and three.role(1) == ("standby", 5)
    assert await client.get("k") == b"v"
    assert client.status()["failovers"] == 0


async def test_a_server_that_serves_nothing_hands_nothing_down(three):
    await three.client().set("k", b"v")  # promotes candidate 0
    assert await hand_down(three.servers[1], [three.endpoints[2]]) == ""
    assert await hand_down(three.servers[0], [three.endpoints[0]]) == ""  # itself
    assert [three.role(i)[0] for i in range(3)] == ["serving", "standby", "standby"]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("x", "items: must be a list of [key, base64 value, ttl or null]"),
        ([["k", "dg=="]], "items[0]: \"['k', 'dg==']\" is not [key, base64 value, ttl]"),
        ([["", "dg==", None]], "items[0]: key '' must be a non-empty string"),
        ([["k", "!!", None]], "items[0]: value of 'k' must be base64"),
        ([["k", "dg==", "soon"]], "items[0]: ttl of 'k' is 'soon', not a number of seconds"),
    ],
)
async def test_a_bad_inherit_request_is_400_naming_the_field_and_changes_nothing(
    three, items, message
):
    body = json.dumps({"term": 2, "items": items}).encode()
    status, doc = await post(three.endpoints[1], "inherit", body, {})
    assert (status, doc["error"]) == (400, message)
    assert three.role(1) == ("standby", 0)


async def test_a_candidate_that_dies_as_it_is_handed_the_store_leaves_it_serving_here(
    three, monkeypatch
):
    """The candidate answers its role, then its process is gone before the state reaches
    it (connection refused): nothing serves the state there, so this server serves on."""
    from agentd.store.candidacy import Candidacy

    client = three.client()
    await client.set("k", b"v")
    ask = Candidacy.ask

    async def dies_first(self, endpoint, op, body):
        if op == "inherit":
            await three.stop(three.endpoints.index(endpoint))
        return await ask(self, endpoint, op, body)

    monkeypatch.setattr(Candidacy, "ask", dies_first)
    assert await hand_down(three.servers[0], three.endpoints[1:2]) == ""
    assert three.role(0) == ("serving", 1)
    assert await client.get("k") == b"v"
    assert client.status()["failovers"] == 0


async def test_a_state_larger_than_any_other_request_may_be_is_handed_down_whole(three):
    """A store's state outgrows the 4 MiB a request may carry at about 5,000 nodes: the
    authorized ``inherit`` alone may carry more (128 MiB), and every key arrives."""
    from agentd.store.server import MAX_BODY

    client = three.client()
    big = [(f"job/record/{i}", bytes([i]) * (1 << 20)) for i in range(6)]  # 8 MiB as sent
    for key, value in big:
        await client.set(key, value)
    assert await hand_down(three.servers[0], [three.endpoints[1]]) == three.endpoints[1]
    assert three.role(1) == ("serving", 2)
    assert await client.multi_get([key for key, _ in big]) == [value for _, value in big]
    # the larger limit is the authorized inherit's alone
    body = b"{" + b" " * MAX_BODY + b"}"
    status, doc = await post(three.endpoints[2], "role", body, {})
    assert (status, doc["error"]) == (413, f"body: larger than {MAX_BODY} bytes")
    status, doc = await post(three.endpoints[2], "inherit", body, {"Authorization": "Bearer x"})
    assert (status, doc["error"]) == (413, f"body: larger than {MAX_BODY} bytes")


async def test_a_state_too_large_to_send_is_kept_and_served_here(three, monkeypatch, caplog):
    import agentd.store.succession as succession

    client = three.client()
    await client.set("k", b"v" * 3000)
    monkeypatch.setattr(succession, "INHERIT_MAX_BODY", 2048)
    with caplog.at_level(logging.INFO):
        assert await hand_down(three.servers[0], [three.endpoints[1]]) == ""
    assert three.role(0) == ("serving", 1) and three.role(1) == ("standby", 1)
    assert "its state, 1 keys (0.0 MiB), is more than a successor may be sent" in caplog.text
    assert await client.get("k") == b"v" * 3000 and client.status()["failovers"] == 0
