"""The store host's record of its last round, kept across its own restart
(agentd/rendezvous/host_memory.py): what is kept, when it is stale, and where."""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.forgotten import Forgotten, lifetime
from agentd.rendezvous.host_memory import TOLD_WITHIN, FileKeeper, HostMemory, file_keeper
from agentd.rendezvous.keys import RunKeys
from agentd.store import candidacy as candidacy_module
from agentd.store.candidacy import LOOK_EVERY
from agentd.store.memory import MemoryStore
from tests.store.test_standby import Job

INTERVAL = 0.5
TTL = 2.0
KEYS = RunKeys("job")


async def restore(memory: HostMemory, rounds: SimpleNamespace, now: float) -> Carried | None:
    """Start as the store's host: ``memory`` restores into a new, empty store."""
    return await memory.restore(rounds, MemoryStore(), KEYS, TTL, now)  # type: ignore[arg-type]


class Clock:
    """A store's clock that the test moves (no stall: the store counts every second)."""

    def __init__(self) -> None:
        self.now = 0.0

    def store(self) -> MemoryStore:
        return MemoryStore(clock=lambda: self.now, stall_guard=False)


def fresh_rounds() -> SimpleNamespace:
    """A restarted agent's rounds: nothing carried, no floor."""
    return SimpleNamespace(carried=None, floor=0)


async def test_a_restarted_host_fences_the_round_its_record_names(tmp_path):
    keeper = FileKeeper(tmp_path / "run" / "store_round_29500.json")
    before = HostMemory(keeper, "job", INTERVAL)
    served = SimpleNamespace(carried=Carried(4, 3, True, "inst-a"), floor=5)
    assert await restore(before, served, now=100.0) is None  # its own start found none
    before.renewed(110.0)  # a lease renewed to t=110

    clock = Clock()
    after, store = fresh_rounds(), clock.store()
    memory = HostMemory(FileKeeper(keeper.path), "job", INTERVAL)
    carried = await memory.restore(after, store, KEYS, TTL, 112.0)  # type: ignore[arg-type]

    # never as a member: the old agent's workers count gone through its guardian
    assert carried == Carried(4, 3, False, "inst-a")
    # the fence, as the first member to reach a store that forgot the run writes it; the
    # round is not carried (in the job's store, once ours steps down, it would be stale)
    assert Forgotten.decode(await store.get(KEYS.forgotten) or b"") == Forgotten(4, 3, "inst-a")
    assert after.carried is None and after.floor == 5
    clock.now = lifetime(TTL) - 0.01  # the fence outlives every lease the old store granted
    assert await store.get(KEYS.forgotten) is not None
    doc = json.loads(keeper.path.read_text())
    # a lease the old store granted ends by one interval after ours; then the guardian's
    # kill, the fence and a cut-off store's renewals (forgotten.lifetime's terms)
    assert doc["until"] == 110.0 + INTERVAL + 0.5 + 1.0 + 3.0


async def test_a_record_past_its_leases_or_of_another_boot_holds_the_first_round_briefly(
    tmp_path,
):
    """The job may live on elsewhere, whose serving candidate tells this host its term
    within :data:`TOLD_WITHIN`: a round sealed here first would run beside it."""
    path = tmp_path / "store_round_1.json"
    memory = HostMemory(FileKeeper(path), "job", INTERVAL)
    await restore(memory, SimpleNamespace(carried=Carried(2, 2, True), floor=3), now=0.0)
    memory.renewed(10.0)
    until = json.loads(path.read_text())["until"]

    for now, boot in ((until + 100.0, None), (11.0, "another-boot")):
        if boot is not None:  # monotonic times restart with the machine
            path.write_text(json.dumps({**json.loads(path.read_text()), "boot": boot}))
        clock = Clock()
        store, late = clock.store(), fresh_rounds()
        restarted = HostMemory(FileKeeper(path), "job", INTERVAL)
        held = await restarted.restore(late, store, KEYS, TTL, now)  # type: ignore[arg-type]
        assert held == Carried(2, 2, False) and late.floor == 3
        assert await store.get(KEYS.forgotten) is not None
        clock.now = TOLD_WITHIN + 0.01  # not lifetime(TTL), 6.5 s: no lease is left
        assert await store.get(KEYS.forgotten) is None
    assert TOLD_WITHIN > LOOK_EVERY  # one telling interval, and its answer

    path.write_text("{not json")  # a torn or foreign file: dropped, nothing fenced
    store = MemoryStore()
    broken = HostMemory(FileKeeper(path), "job", INTERVAL)
    assert await broken.restore(fresh_rounds(), store, KEYS, TTL, 0.0) is None  # type: ignore[arg-type]
    assert await store.get(KEYS.forgotten) is None


class Seed(SimpleNamespace):
    """The seed's candidacy as the record reads it: the list it served."""


async def test_a_round_of_this_host_alone_with_no_other_candidate_fences_nothing(tmp_path):
    """A one-node job's host killed and started again: nobody else ran workers on its
    leases or can serve the job, and its own old workers are gone, so its first round does
    not wait (it waited out the old lease, 19.6 s with the defaults). A round with another
    member, one it was a spare of, or a list that grew, is fenced as before."""
    path = tmp_path / "store_round_1.json"
    cases = [
        (Carried(2, 1, True), ["h:1"], False),  # alone: nothing to fence
        (Carried(2, 1, False), ["h:1"], True),  # another node's round of one
        (Carried(2, 2, True), ["h:1"], True),  # another member
        (Carried(2, 1, True), ["h:1", "h:2"], True),  # a candidate stood by
    ]
    for carried, endpoints, fenced in cases:
        served = SimpleNamespace(carried=carried, floor=3)
        before = HostMemory(FileKeeper(path), "job", INTERVAL, Seed(endpoints=endpoints))
        await restore(before, served, now=0.0)
        before.renewed(10.0)
        store, rounds = MemoryStore(), fresh_rounds()
        after = HostMemory(FileKeeper(path), "job", INTERVAL)
        held = await after.restore(rounds, store, KEYS, TTL, 11.0)  # type: ignore[arg-type]
        assert (held is not None, await store.get(KEYS.forgotten) is not None) == (
            fenced,
            fenced,
        ), (carried, endpoints)
        assert rounds.floor == (3 if fenced else 0)
        assert path.exists() == fenced  # a record with nothing to fence is gone
        path.unlink(missing_ok=True)


async def test_the_new_agent_keeps_its_own_rounds_until_it_hands_over_or_the_end(tmp_path):
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

    # leaving, it hands the store over: the job's leases are renewed at the next
    # candidate, which tells this endpoint its term; a restart holds only TOLD_WITHIN
    second.handed_over(40.0)
    second.renewed(45.0)  # its last heartbeats change nothing now
    assert json.loads(path.read_text())["until"] == 40.0
    clock = Clock()
    store = clock.store()
    third = HostMemory(FileKeeper(path), "job", INTERVAL)
    assert await third.restore(fresh_rounds(), store, KEYS, TTL, 41.0) is not None  # type: ignore[arg-type]
    clock.now = TOLD_WITHIN + 0.01
    assert await store.get(KEYS.forgotten) is None

    third.forget()  # the run closed, or everyone left
    assert not path.exists()


async def test_the_record_keeps_the_list_and_the_restarted_host_asks_it_for_the_job(
    tmp_path, monkeypatch
):
    """Real candidate servers on loopback: the job fails over to a member as the host is
    lost, and the host restarts. Its record names the list, so it asks it at once and
    stands by, and a new node's client goes to the job, without the 2 s telling."""
    monkeypatch.setattr(candidacy_module, "LOOK_EVERY", 60.0)  # no telling: the ask alone
    job = Job()
    seed = await job.start_seed()
    try:
        member, _ = await job.member(2)
        path = tmp_path / "store_round_1.json"
        served = SimpleNamespace(carried=Carried(2, 2, True), floor=3)
        memory = HostMemory(FileKeeper(path), "job", INTERVAL, seed.candidacy)
        await restore(memory, served, now=0.0)
        memory.renewed(10.0)
        assert json.loads(path.read_text())["candidates"] == list(member.endpoints)
        await seed.stop()
        job.server = None
        await member.set("moved", b"1")  # the job fails over to the member's candidate

        restarted = await job.start_seed()  # an empty store, under term 1
        again = HostMemory(FileKeeper(path), "job", INTERVAL, restarted.candidacy)
        await restore(again, fresh_rounds(), now=11.0)
        assert restarted.candidacy.role == "standby" and restarted.candidacy.term == 2
        assert restarted.candidacy.endpoints == member.endpoints
        newcomer = job.client()
        assert await newcomer.get("moved") == b"1"
        assert newcomer.endpoints == member.endpoints and newcomer.term == 2
    finally:
        await job.close()


def test_without_a_log_dir_the_record_is_kept_only_in_a_folder_of_ours(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    keeper = file_keeper(None, "job", 29500)
    assert keeper is not None
    assert keeper.path == tmp_path / f"agentd-{os.getuid()}" / "job" / "store_round_29500.json"
    keeper.save({"generation": 1})
    assert keeper.load() is not None
    assert (tmp_path / f"agentd-{os.getuid()}").stat().st_mode & 0o777 == 0o700
    keeper.clear()  # nothing of the run is left in the shared temporary directory
    assert list((tmp_path / f"agentd-{os.getuid()}").iterdir()) == []

    shared = tmp_path / "shared"
    monkeypatch.setenv("TMPDIR", str(shared))
    shared.mkdir()
    planted = shared / f"agentd-{os.getuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # anyone could have made it, and may write in it
    other = file_keeper(None, "job", 29500)
    assert other is not None
    with caplog.at_level(logging.WARNING, logger="agentd.rendezvous.host_memory"):
        other.save({"generation": 1})
        other.save({"generation": 2})
    assert not other.path.exists()
    [said] = [r.getMessage() for r in caplog.records]
    assert str(other.path) in said and "not fenced" in said

    with_logs = file_keeper(str(tmp_path / "logs"), "job", 29500)
    assert with_logs is not None
    assert with_logs.path == tmp_path / "logs" / "job" / "store_round_29500.json"
    for unsafe in ("../elsewhere", "a/b", "..", ""):  # torch's API passes any run id
        assert file_keeper(str(tmp_path / "logs"), unsafe, 29500) is None
