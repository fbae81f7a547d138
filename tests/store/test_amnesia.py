"""A store restarted empty tells its clients how long ago its previous self held leases
(agentd/store/amnesia.py): its record on disk, the word it keeps in the new store, and
``agentd store`` killed and started again on its port."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentd.store import amnesia
from agentd.store.http_client import HttpStore
from agentd.store.memory import MemoryStore
from tests.conftest import wait_until


async def test_the_record_lives_while_the_store_holds_ttl_keys(tmp_path):
    store, record = MemoryStore(), amnesia.AliveRecord(tmp_path / "store-1.alive", boot="b")
    await store.set("plain", b"x")
    record.note(store)
    assert not record.path.exists(), "a store without leases has nothing to fence"

    await store.set("agentd/job/ctl/hb/n0", b"", ttl=0.3)
    await store.set("agentd/job/ctl/hb/n1", b"", ttl=0.2)
    record.note(store)
    doc = json.loads(record.path.read_text())
    assert doc["boot"] == "b" and doc["ttl"] == pytest.approx(0.3)
    assert time.monotonic() - doc["alive"] < 5
    forgot = record.load()
    assert forgot is not None and forgot.ttl == pytest.approx(0.3)
    assert 0 <= forgot.ago < 5 and forgot.worth_telling

    deadline = time.monotonic() + 10
    while store.holds_ttl_keys and time.monotonic() < deadline:  # both leases lapse
        await asyncio.sleep(0.05)
    record.note(store)
    assert not record.path.exists(), "the record outlived the store's last lease"
    await store.close()


def test_another_boots_record_or_an_unreadable_one_says_nothing(tmp_path):
    path = tmp_path / "store-1.alive"
    doc = {"boot": "earlier", "alive": time.monotonic(), "ttl": 15.0}
    path.write_text(json.dumps(doc))
    assert amnesia.AliveRecord(path, boot="now").load() is None
    assert amnesia.AliveRecord(path, boot="earlier").load() is not None
    for text in ("", "{", '{"boot": "now"}', '["now"]', '{"boot": "now", "alive": "x", "ttl": 1}'):
        path.write_text(text)
        assert amnesia.AliveRecord(path, boot="now").load() is None, text
    # long ago: the word is not worth telling any more
    path.write_text(json.dumps({"boot": "now", "alive": time.monotonic() - 600, "ttl": 15.0}))
    forgot = amnesia.AliveRecord(path, boot="now").load()
    assert forgot is not None and not forgot.worth_telling


@pytest.mark.parametrize(
    "raw, ago",
    [
        (b'{"ago": 1.5}', 1.5),
        (b'{"ago": 0}', 0.0),
        (None, None),
        (b"", None),
        (b'{"ago": true}', None),
        (b'{"ago": -1}', None),
        (b'{"ago": "3"}', None),
        (b"[1]", None),
    ],
)
def test_only_a_word_of_ours_is_read(raw, ago):
    assert amnesia.read_word(raw) == ago


async def test_the_word_grows_with_the_time_and_goes_once_no_lease_can_be_left():
    store = MemoryStore()
    # one second left to tell: written now, then once more at most, then deleted
    forgot = amnesia.Forgot(ago=amnesia.BEYOND + 0.5, ttl=0.0)
    telling = asyncio.create_task(amnesia.tell(store, forgot))
    await asyncio.sleep(0)
    said = amnesia.read_word(await store.get(amnesia.KEY))
    assert said == pytest.approx(amnesia.BEYOND + 0.5, abs=0.2)
    await asyncio.wait_for(telling, timeout=10)
    assert await store.get(amnesia.KEY) is None
    await store.close()


async def _lease(endpoint: str, ttl: float) -> None:
    client = HttpStore(endpoint, token="job-secret")
    try:
        await client.set("agentd/job/ctl/hb/n0", b"", ttl=ttl)
    finally:
        await client.close()


async def _word(endpoint: str) -> bytes | None:
    client = HttpStore(endpoint, token="job-secret")
    try:
        return await client.get(amnesia.KEY)
    finally:
        await client.close()


def _restart(run_store, store):
    store.proc.kill()
    store.proc.wait()
    again = run_store(port=store.port)
    wait_until(lambda: "Store: serving on" in again.err.read_text(), what="the store to serve")
    return again


def test_agentd_store_killed_and_started_again_on_its_port_tells_its_clients(run_store):
    """A real ``agentd store`` whose lease lapsed keeps no record, and started again says
    nothing; one SIGKILLed holding a lease and started again on its port says, in its log
    and under the word's key, that its previous self held leases moments ago."""
    store = run_store()
    record = os.path.join(os.environ["XDG_RUNTIME_DIR"], "agentd", f"store-{store.port}.alive")
    asyncio.run(_lease(store.endpoint, 0.5))  # recorded as it is written
    wait_until(lambda: os.path.exists(record), what="the store's record of its lease")
    wait_until(lambda: not os.path.exists(record), what="the record's end with the lease")
    quiet = _restart(run_store, store)
    assert "previous self" not in quiet.err.read_text()  # said before it serves, or never
    assert asyncio.run(_word(quiet.endpoint)) is None

    asyncio.run(_lease(quiet.endpoint, 15.0))
    wait_until(lambda: os.path.exists(record), what="the store's record of its lease")
    again = _restart(run_store, quiet)
    said = again.err.read_text()
    assert "its previous self last held leases (TTLs up to 15s)" in said, said
    ago = amnesia.read_word(asyncio.run(_word(again.endpoint)))
    assert ago is not None and 0 <= ago < 15.0 + amnesia.EVERY, ago
