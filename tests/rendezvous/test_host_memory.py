"""The store host's record of its last round, kept across its own restart
(agentd/rendezvous/host_memory.py): what is kept, when it is stale, and where."""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.forgotten import Forgotten
from agentd.rendezvous.host_memory import FileKeeper, HostMemory, file_keeper
from agentd.rendezvous.keys import RunKeys
from agentd.store.memory import MemoryStore

INTERVAL = 0.5
TTL = 2.0
KEYS = RunKeys("job")


async def restore(memory: HostMemory, rounds: SimpleNamespace, now: float) -> Carried | None:
    """Start as the store's host: ``memory`` restores into a new, empty store."""
    return await memory.restore(rounds, MemoryStore(), KEYS, TTL, now)  # type: ignore[arg-type]


def fresh_rounds() -> SimpleNamespace:
    """A restarted agent's rounds: nothing carried, no floor."""
    return SimpleNamespace(carried=None, floor=0)


async def test_a_restarted_host_fences_the_round_its_record_names(tmp_path):
    keeper = FileKeeper(tmp_path / "run" / "store_round_29500.json")
    before = HostMemory(keeper, "job", INTERVAL)
    served = SimpleNamespace(carried=Carried(4, 3, True, "inst-a"), floor=5)
    assert await restore(before, served, now=100.0) is None  # its own start found none
    before.renewed(110.0)  # a lease renewed to t=110

    after, store = fresh_rounds(), MemoryStore()
    memory = HostMemory(FileKeeper(keeper.path), "job", INTERVAL)
    carried = await memory.restore(after, store, KEYS, TTL, 112.0)  # type: ignore[arg-type]

    # never as a member: the old agent's workers count gone through its guardian
    assert carried == Carried(4, 3, False, "inst-a")
    # the fence, as the first member to reach a store that forgot the run writes it; the
    # round is not carried (in the job's store, once ours steps down, it would be stale)
    assert Forgotten.decode(await store.get(KEYS.forgotten) or b"") == Forgotten(4, 3, "inst-a")
    assert after.carried is None and after.floor == 5
    doc = json.loads(keeper.path.read_text())
    # a lease the old store granted ends by one interval after ours; then the guardian's
    # kill, the fence and a cut-off store's renewals (forgotten.lifetime's terms)
    assert doc["until"] == 110.0 + INTERVAL + 0.5 + 1.0 + 3.0


async def test_a_record_past_its_leases_or_of_another_boot_is_not_fenced(tmp_path):
    path = tmp_path / "store_round_1.json"
    memory = HostMemory(FileKeeper(path), "job", INTERVAL)
    await restore(memory, SimpleNamespace(carried=Carried(2, 2, True), floor=3), now=0.0)
    memory.renewed(10.0)
    until = json.loads(path.read_text())["until"]

    late = fresh_rounds()
    assert await restore(HostMemory(FileKeeper(path), "job", INTERVAL), late, until + 0.1) is None
    assert late.floor == 0
    assert not path.exists()  # stale: removed

    memory.renewed(10.0)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "boot": "another-boot"}))  # monotonic times restart
    other_boot = HostMemory(FileKeeper(path), "job", INTERVAL)
    assert await restore(other_boot, fresh_rounds(), now=11.0) is None


async def test_the_new_agent_keeps_its_own_rounds_and_forgets_them_at_the_end(tmp_path):
    path = tmp_path / "store_round_1.json"
    first = HostMemory(FileKeeper(path), "job", INTERVAL)
    await restore(first, SimpleNamespace(carried=Carried(2, 2, True), floor=3), now=0.0)
    first.renewed(10.0)

    rounds = fresh_rounds()
    second = HostMemory(FileKeeper(path), "job", INTERVAL)
    assert await restore(second, rounds, now=11.0) is not None
    second.renewed(30.0)  # no round seen yet: the old record stands as it was
    assert json.loads(path.read_text())["generation"] == 2
    rounds.carried = Carried(3, 2, True)  # a round sealed in the new store is kept
    second.renewed(30.0)
    assert json.loads(path.read_text())["generation"] == 3

    second.forget()  # the run closed, or everyone left
    assert not path.exists()


def test_without_a_log_dir_the_record_is_kept_only_in_a_folder_of_ours(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    keeper = file_keeper(None, "job", 29500)
    assert keeper.path == tmp_path / f"agentd-{os.getuid()}" / "job" / "store_round_29500.json"
    keeper.save({"generation": 1})
    assert keeper.load() is not None
    assert (tmp_path / f"agentd-{os.getuid()}").stat().st_mode & 0o777 == 0o700

    shared = tmp_path / "shared"
    monkeypatch.setenv("TMPDIR", str(shared))
    shared.mkdir()
    planted = shared / f"agentd-{os.getuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # anyone could have made it, and may write in it
    other = file_keeper(None, "job", 29500)
    with caplog.at_level(logging.WARNING, logger="agentd.rendezvous.host_memory"):
        other.save({"generation": 1})
        other.save({"generation": 2})
    assert not other.path.exists()
    [said] = [r.getMessage() for r in caplog.records]
    assert str(other.path) in said and "not fenced" in said

    with_logs = file_keeper(str(tmp_path / "logs"), "job", 29500)
    assert with_logs.path == tmp_path / "logs" / "job" / "store_round_29500.json"
