"""DynamicRendezvous: many handlers over one store, in one loop (in-process and over HTTP)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest

from agentd.rendezvous import exit_barrier, rounds
from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.sealing import ENDED
from agentd.store.api import (
    Store,
    StoreError,
    StoreLeft,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from agentd.store.connect import OpenedStore
from agentd.store.etcd.store import EtcdStore
from agentd.store.http_client import HttpStore
from agentd.store.memory import MemoryStore
from agentd.store.server import StoreServer
from tests.conftest import free_port

FAST = {
    "keep_alive_interval": 0.1,
    "keep_alive_max_attempt": 3,
    "last_call_timeout": 0.2,
    "join_timeout": 20.0,
}

ETCD_ATTEMPTS = 50
"""On etcd a node's heartbeats may all miss for 5 s (50 x 0.1 s) before its lease ends, not
FAST's 0.3 s: etcd rounds a lease up to a second and runs it on its own clock, and on a
loaded 2-core machine a stall of etcd or of the test's loop once outlasted 1 s (a 3 s
stall of the loop lapses a 2 s lease: tried by hand on 2026-12-01). The node whose lease
lapsed as its round was sealed then ended the round, as it must, after its peer had
returned from it (the peer's ``next_rendezvous`` was not called again), and waited alone
until the join timeout. A test of a lapsed lease builds its handlers with
``lapses=True``: it waits for the lease, so it keeps a shorter one
(:data:`ETCD_LAPSING_ATTEMPTS`), and only such tests take the risk."""

ETCD_LAPSING_ATTEMPTS = 20
"""The lease on etcd of a node whose heartbeat a test stops: 2 s, waited for in full."""


class Counting:
    """A store that counts the operations its clients make (``by_name``: each one's)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.ops = 0
        self.by_name: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        found = getattr(self.inner, name)
        if callable(found):  # an operation, not a property read (``incarnation``)
            self.ops += 1
            self.by_name[name] += 1
        return found


@pytest.fixture(params=["memory", "etcd"])
async def store(request) -> AsyncIterator[Counting]:
    """The rendezvous on the embedded store's core, and on a real etcd (the same code)."""
    if request.param == "etcd":
        cluster = request.getfixturevalue("etcd_cluster")
        inner: Store = EtcdStore(cluster.urls, prefix=f"/rdzv/{uuid.uuid4().hex}/")
    else:
        inner = MemoryStore()
    counting = Counting(inner)
    yield counting
    await inner.close()


def handler(store, run_id="job", nodes=(1, 1), role="default", nproc=1, lapses=False, **settings):
    async def open_store() -> OpenedStore:
        async def nothing() -> None:
            pass

        return OpenedStore(store, nothing)

    if isinstance(getattr(store, "inner", store), EtcdStore):
        attempts = ETCD_LAPSING_ATTEMPTS if lapses else ETCD_ATTEMPTS
        settings.setdefault("keep_alive_max_attempt", attempts)
    conf = RendezvousSettings(min_nodes=nodes[0], max_nodes=nodes[1], **{**FAST, **settings})
    return DynamicRendezvous(run_id, open_store, conf, role=role, local_world_size=nproc)


async def shutdown_all(*handlers: DynamicRendezvous) -> None:
    for h in handlers:
        await h.shutdown()


async def test_a_full_round_completes_with_ranks_master_and_role_infos(store):
    nodes = [
        handler(store, nodes=(3, 3), role="trainer" if i else "reader", nproc=i + 1)
        for i in range(3)
    ]
    infos = await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    try:
        assert sorted(i.group_rank for i in infos) == [0, 1, 2]
        assert {i.group_world_size for i in infos} == {3}
        assert len({(i.master_addr, i.master_port) for i in infos}) == 1
        assert {i.generation for i in infos} == {0}
        by_rank = {i.group_rank: i for i in infos}
        roles = by_rank[0].role_infos
        assert [r.rank for r in roles] == [0, 1, 2]
        assert all(i.role_infos == roles for i in infos)  # every node sees the same table
    finally:
        await shutdown_all(*nodes)


async def test_store_operations_per_node_stay_constant_as_the_job_grows(store):
    per_node = {}
    for size in (4, 32):
        store.ops = 0
        nodes = [
            handler(store, run_id=f"grow{size}", nodes=(size, size), keep_alive_interval=60)
            for _ in range(size)
        ]  # no heartbeats: they count seconds, not rounds
        await asyncio.gather(*(h.next_rendezvous() for h in nodes))
        per_node[size] = store.ops / size
        await shutdown_all(*nodes)
    assert per_node[32] <= per_node[4] + 1, per_node  # linear in total, not quadratic


async def test_only_the_sealer_reads_every_entry_so_reads_grow_linearly(store):
    """N members each reading N entries made a 1,024-node rendezvous quadratic."""
    read = {"keys": 0}
    multi_get = store.inner.multi_get

    async def counted(keys):
        read["keys"] += len(keys)
        return await multi_get(keys)

    store.inner.multi_get = counted
    per_node = {}
    for size in (8, 64):
        read["keys"] = 0
        nodes = [
            handler(store, run_id=f"reads{size}", nodes=(size, size), keep_alive_interval=60)
            for _ in range(size)
        ]
        infos = await asyncio.gather(*(h.next_rendezvous() for h in nodes))
        assert all(len(i.role_infos) == size for i in infos)
        per_node[size] = read["keys"] / size
        await shutdown_all(*nodes)
    assert per_node[64] <= per_node[8] + 2, per_node


async def test_a_node_joins_a_round_in_five_store_requests(store):
    """Heartbeat, generation, arrival, entry, watch: the sealer reads the entries once more
    and writes the seal; nobody creates the generation key for round 0."""
    size = 16
    nodes = [
        handler(store, run_id="five", nodes=(size, size), keep_alive_interval=60)
        for _ in range(size)
    ]
    for node in nodes:
        await node._open()
    await asyncio.sleep(0.05)  # their heartbeat tasks started (and looked up their method)
    store.by_name.clear()
    await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    assert store.by_name.total() <= 5 * size + 4, store.by_name
    assert await store.get("agentd/five/ctl/gen") is None
    await shutdown_all(*nodes)


async def test_a_lost_member_is_noticed_while_its_predecessor_waits_in_the_exit_barrier(store):
    """Rank 0's workers finished: it waits in the exit barrier, not watching. Rank 1 dies;
    ranks 2 and 3 watch it too (each member watches the next three), and end the round."""
    nodes = [handler(store, nodes=(1, 4), lapses=True) for _ in range(4)]
    infos = await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    by_rank = {info.group_rank: h for info, h in zip(infos, nodes, strict=True)}
    barrier = asyncio.create_task(by_rank[0].exit_barrier())
    watches = [asyncio.create_task(by_rank[r].round_over()) for r in (2, 3)]
    lost = by_rank[1]
    assert lost._membership is not None and lost._rounds is not None
    await lost._membership.stop()
    lost._rounds.release()
    reasons = await asyncio.wait_for(asyncio.gather(*watches), 10)
    assert f"node 127.0.0.1 ({lost.node_id}) left (no heartbeat)" in reasons
    barrier.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await barrier
    await shutdown_all(by_rank[0], by_rank[2], by_rank[3])


async def test_a_round_sealed_by_an_older_agentd_is_a_clear_error(store):
    """Agents before the round summary sealed a round with its member count alone."""
    await store.set("agentd/job/round/0/sealed", b"2")
    node = handler(store, nodes=(1, 2), last_call_timeout=0.05)
    try:
        with pytest.raises(RendezvousStateError, match="same agentd version"):
            await asyncio.wait_for(node.next_rendezvous(), 10)
    finally:
        await shutdown_all(node)


async def test_an_arrival_that_never_writes_its_entry_ends_the_round(store):
    """It took its place (add) and died: the sealer waits a heartbeat TTL for its entry,
    then ends the round, and the living meet in the next one."""
    await store.add("agentd/job/round/0/join", 1)  # place 0, and nothing more
    a, b = handler(store, nodes=(2, 3), lapses=True), handler(store, nodes=(2, 3), lapses=True)
    try:
        infos = await asyncio.wait_for(asyncio.gather(a.next_rendezvous(), b.next_rendezvous()), 10)
        assert {(i.generation, i.group_world_size) for i in infos} == {(1, 2)}
    finally:
        await shutdown_all(a, b)


async def test_a_spare_beside_a_full_round_nobody_sealed_ends_it(store, monkeypatch):
    """Both arrivals that filled the round joined again elsewhere (the store failed over
    during their joins) and left their places empty, so nobody sealed it; the spare that
    found it full waited for ever (seed 1611 of ``bench/simulate.py --failover``). At its
    second check, the spare seals it as its last arrival would have: with its places
    still empty, that ends it, and the spare takes a place in the next round."""
    monkeypatch.setattr(rounds, "SPARE_CHECK", 0.2)
    await store.add("agentd/job/round/0/join", 2)  # places 0 and 1, and nothing more
    spare = handler(store, nodes=(1, 2), keep_alive_max_attempt=3)  # alone: a short TTL
    try:
        info = await asyncio.wait_for(spare.next_rendezvous(), 10)
        assert (info.generation, info.group_world_size) == (1, 1)
    finally:
        await shutdown_all(spare)


async def test_a_round_marked_ended_whose_generation_never_moved_is_moved_past(store):
    """A round is ended by moving the generation, then marking the round; a failover
    between the two resent the mark to the new store, whose generation never moved, and
    every agent joined the ended round again and again until it was full, then waited
    beside it for ever (seed 42455 of ``bench/simulate.py --failover``)."""
    await store.set("agentd/job/round/0/sealed", ENDED)  # the mark alone, as resent
    node = handler(store, nodes=(1, 1))
    try:
        info = await asyncio.wait_for(node.next_rendezvous(), 10)
        assert (info.generation, info.group_world_size) == (1, 1)
    finally:
        await shutdown_all(node)


class Overloaded(MemoryStore):
    """A store that applies the first ``add`` and loses its answer (etcd's ``request timed
    out`` under load): the arrival counted, its outcome unknown to the agent."""

    lost = False

    async def add(self, key: str, delta: int) -> int:
        value = await super().add(key, delta)
        if not self.lost:
            self.lost = True
            raise StoreOutcomeUnknown("add failed (request timed out); not resent")
        return value


async def test_an_arrival_of_unknown_outcome_joins_again_even_in_the_first_rendezvous():
    """Not a configuration problem (the store took the request): the node joins again, and
    its arrival the store may have counted ends that round, as one that never wrote its
    entry does."""
    store = Overloaded()
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    try:
        infos = await asyncio.wait_for(asyncio.gather(a.next_rendezvous(), b.next_rendezvous()), 20)
        assert sorted(i.group_rank for i in infos) == [0, 1] and store.lost
    finally:
        await shutdown_all(a, b)
        await store.close()


class Deserted(MemoryStore):
    """A store whose candidates all stop answering a leaving agent's writes once
    ``deserted`` is set (its client raises StoreLeft: a job stopped whole)."""

    deserted = False

    async def compare_set(self, key, *args, **kwargs):
        if self.deserted:
            raise StoreLeft("no store candidate answers: 127.0.0.1:1: cannot connect")
        return await super().compare_set(key, *args, **kwargs)


async def test_a_round_ended_in_a_deserted_store_says_the_others_left_too(caplog):
    """Before, ending the round turned StoreLeft into StoreUnavailable ("the round will
    be ended when it answers"), and such a leave of a job stopped whole logged "could not
    leave cleanly" as a WARNING."""
    caplog.set_level("INFO", logger="agentd.rendezvous")
    store = Deserted()
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    try:
        await asyncio.wait_for(asyncio.gather(a.next_rendezvous(), b.next_rendezvous()), 20)
        store.deserted = True
        with pytest.raises(StoreLeft, match="no store candidate answers"):
            await a.end_round("this node leaves")
        await asyncio.wait_for(a.shutdown(), 10)
        assert "the others have left too (no store candidate answers" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        store.deserted = False
        await shutdown_all(a, b)
        await store.close()


class LosesACount(MemoryStore):
    """A store that applies the first count of a member back in a round and loses its
    answer, until the client gives up: the arrival that fills the round has its entry
    in, its count unknown."""

    lost = False

    async def add_once(self, counter, marker, mark, absent=()):
        answer = await super().add_once(counter, marker, mark, absent)
        if "/back/" in counter and not self.lost:
            self.lost = True
            raise StoreUnavailable("store at http://127.0.0.1:1 is unreachable after 30s")
        return answer


async def test_a_join_cut_short_after_its_entry_resumes_in_its_round(caplog):
    """Seed 28208 of ``bench/simulate.py --failover``: joining again from the start took a
    place past MAX, and the round was sealed with the first place, whose workers nobody
    started. The node goes on in its round: one entry each, sealed at once (the last call
    is a minute away), the count lost and made again, which counts the node once."""
    caplog.set_level("INFO", logger="agentd.rendezvous.rounds")
    store = LosesACount()
    a, b = (handler(store, nodes=(2, 2), last_call_timeout=60.0) for _ in range(2))
    try:
        await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
        await a.end_round("again")
        infos = await asyncio.wait_for(asyncio.gather(a.next_rendezvous(), b.next_rendezvous()), 20)
        assert store.lost and {(i.generation, i.group_world_size) for i in infos} == {(1, 2)}
        assert sorted(i.group_rank for i in infos) == [0, 1]
        assert await store.get("agentd/job/round/1/join") == b"2"  # nobody arrived twice
        assert await store.get("agentd/job/round/1/back/0") == b"2"  # nor came back twice
        assert re.search(r"still node \d of round 1", caplog.text)
    finally:
        await shutdown_all(a, b)
        await store.close()


async def test_a_lost_member_is_noticed_even_when_the_members_watching_it_are_lost_too(store):
    """Each member watches its next three successors: rank 3 is watched by ranks 0, 1
    and 2. All four die: rank 4, which watches 0, 1 and 2, still ends the round."""
    nodes = [handler(store, nodes=(1, 5), lapses=True) for _ in range(5)]
    infos = await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    by_rank = {info.group_rank: h for info, h in zip(infos, nodes, strict=True)}
    survivor = by_rank[4]
    watch = asyncio.create_task(survivor.round_over())
    lost = [by_rank[rank] for rank in range(4)]
    for node in lost:  # their agents were SIGKILLed
        assert node._membership is not None and node._rounds is not None
        await node._membership.stop()
        node._rounds.release()
    why = await asyncio.wait_for(watch, 10)
    assert why in {f"node 127.0.0.1 ({node.node_id}) left (no heartbeat)" for node in lost[:3]}
    info = await survivor.next_rendezvous()
    assert (info.generation, info.group_world_size, info.group_rank) == (1, 1, 0)
    await shutdown_all(survivor)


async def test_last_call_completes_with_min_nodes(store):
    a, b = handler(store, nodes=(2, 3)), handler(store, nodes=(2, 3))
    infos = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    assert {i.group_world_size for i in infos} == {2}
    await shutdown_all(a, b)


@pytest.mark.parametrize("most", [3, 4])
async def test_a_late_node_ends_the_round_and_all_three_meet_in_the_next(store, most):
    """Below MAX (``most`` 4), the late node's place is not the last one, so nothing made
    it read the seal it arrived after: it waited for its own last call (30 s by default,
    60 s here) before it ended the round to be admitted."""
    a, b = handler(store, nodes=(2, most)), handler(store, nodes=(2, most))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    watches = [asyncio.create_task(h.round_over()) for h in (a, b)]
    c = handler(store, nodes=(2, most), last_call_timeout=60.0)
    late = asyncio.create_task(c.next_rendezvous())
    reasons = await asyncio.wait_for(asyncio.gather(*watches), 10)
    assert all("generation 0 ended" in r for r in reasons)
    assert await a.num_nodes_waiting() == 1
    infos = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous(), late)
    assert {(i.generation, i.group_world_size) for i in infos} == {(1, 3)}
    await shutdown_all(a, b, c)


async def test_a_node_beside_a_round_whose_places_late_arrivals_took_ends_it(store):
    """Round 0 of ``2:3`` sealed with two; a late arrival took the third place and died
    before it ended the round (seed 8933 of ``bench/simulate.py --failover --kinds
    ...,restart``). The next node finds every place taken, but the seal says two: there
    is room, so it ends the round and the three meet in the next. Before, it waited
    beside the round as beside a full one, for ever."""
    a, b = handler(store, nodes=(2, 3)), handler(store, nodes=(2, 3))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())  # at the last call
    watches = [asyncio.create_task(h.round_over()) for h in (a, b)]
    assert await store.add(RunKeys("job").round(0, "join"), 1) == 3  # the dead arrival
    c = handler(store, nodes=(2, 3))
    late = asyncio.create_task(c.next_rendezvous())
    reasons = await asyncio.wait_for(asyncio.gather(*watches), 10)
    assert all("generation 0 ended" in r for r in reasons), reasons
    infos = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous(), late)
    assert {(i.generation, i.group_world_size) for i in infos} == {(1, 3)}
    await shutdown_all(a, b, c)


async def test_a_new_node_that_brings_the_round_to_its_minimum_seals_it(store):
    """Four nodes of ``2:4``, three leave for good, a new node arrives: the one left is
    back and the three gone, and the new node's arrival brings the round to its minimum,
    so it seals the round. A node new to the job counted nothing as it arrived, and the
    round waited for the last call (60 s here)."""
    nodes = [handler(store, nodes=(2, 4), last_call_timeout=60.0) for _ in range(4)]
    await asyncio.gather(*(h.next_rendezvous() for h in nodes))  # sealed full, at once
    left, leaving = nodes[0], nodes[1:]
    watch = asyncio.create_task(left.round_over())
    await shutdown_all(*leaving)
    await asyncio.wait_for(watch, 10)
    back = asyncio.create_task(left.next_rendezvous())
    new = handler(store, nodes=(2, 4), last_call_timeout=60.0)
    infos = await asyncio.wait_for(asyncio.gather(back, new.next_rendezvous()), 10)
    assert {(i.generation, i.group_world_size) for i in infos} == {(1, 2)}
    await shutdown_all(left, new)


async def test_a_node_beyond_max_waits_for_a_departure(store):
    # A TTL of 1.5 s: ending the round is bounded by it, and a loaded etcd can take longer
    # than FAST's 0.3 s (b's departure would then be seen as a lost heartbeat instead).
    slow = {"nodes": (1, 2), "keep_alive_interval": 0.5}
    a, b = handler(store, **slow), handler(store, **slow)
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    c = handler(store, **slow)
    spare = asyncio.create_task(c.next_rendezvous())
    await asyncio.sleep(0.3)
    assert not spare.done()  # the round is full: no restart for the others
    watch = asyncio.create_task(a.round_over())
    await b.shutdown()  # b leaves: the round ends, c gets its place
    assert "ended" in await asyncio.wait_for(watch, 10)
    infos = await asyncio.gather(a.next_rendezvous(), spare)
    assert {(i.generation, i.group_world_size) for i in infos} == {(1, 2)}
    await shutdown_all(a, c)


async def test_a_second_shutdown_while_the_first_runs_waits_for_it(store):
    """A second stop signal while the agent leaves: one leave, which ends the round for
    the others at once. Two at once raced, and the first to end closed the store under
    the other (seed 8218 of ``bench/simulate.py --failover``: the round was fenced for
    16.5 s instead of ended)."""
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    watch = asyncio.create_task(a.round_over())
    await asyncio.gather(b.shutdown(), b.shutdown())
    assert "generation 0 ended" in await asyncio.wait_for(watch, 10)
    assert await store.get(f"agentd/job/ctl/hb/{b.node_id}") is None
    await b.shutdown()  # once it is over: nothing more to do
    await shutdown_all(a)


async def test_the_services_of_an_agent_that_left_find_its_store_closed():
    """A service still at work as its agent leaves (a drain waiting for checkpoints when
    the job's workers succeed) is told the store is gone (a StoreError, which it handles)
    once the rendezvous closed it. It was a RuntimeError, whose traceback ended an
    agent's exit (``bench/bench_chaos.py --inprocess --stragglers``, seed 3)."""
    node = handler(MemoryStore())
    with pytest.raises(RuntimeError, match="not opened"):  # a caller's bug: before the first
        await node.timings.verdict(0)
    await node.next_rendezvous()
    assert await node.timings.verdict(0) is None
    await node.shutdown()
    with pytest.raises(StoreError, match="this agent left; its store is closed"):
        await node.timings.verdict(0)


async def test_an_expired_heartbeat_ends_the_round(store):
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2), lapses=True)
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    watch = asyncio.create_task(a.round_over())
    assert b._membership is not None
    await b._membership.stop()  # b's agent was SIGKILLed: its heartbeat stops, nothing else
    assert b._rounds is not None
    b._rounds.release()  # ... and its sockets close with it
    why = await asyncio.wait_for(watch, 10)
    assert f"node 127.0.0.1 ({b.node_id}) left (no heartbeat)" == why
    info = await a.next_rendezvous()
    assert (info.generation, info.group_world_size, info.group_rank) == (1, 1, 0)
    await shutdown_all(a)


async def test_old_rounds_are_forgotten_so_the_store_stays_flat(store):
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    sizes = []
    for generation in range(12):
        infos = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
        assert {i.generation for i in infos} == {generation}
        sizes.append(await store.inner.num_keys())
        await a.end_round("again")
    assert sizes[-1] == sizes[3], sizes  # two rounds' keys at most, whatever the count
    await shutdown_all(a, b)


async def test_end_round_reaches_every_peer(store):
    nodes = [handler(store, nodes=(3, 3)) for _ in range(3)]
    await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    watches = [asyncio.create_task(h.round_over()) for h in nodes[1:]]
    await nodes[0].end_round("a worker failed")
    assert all(
        "generation 0 ended" in r for r in await asyncio.wait_for(asyncio.gather(*watches), 10)
    )
    assert json.loads(await store.get("agentd/job/ctl/gen") or b"") == 1
    await nodes[0].end_round("twice")  # one round ends once
    assert await store.get("agentd/job/ctl/gen") == b"1"
    await shutdown_all(*nodes)


async def test_closing_on_failure_stops_peers_and_turns_away_newcomers(store):
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    watch = asyncio.create_task(b.round_over())
    await a.set_closed(False, "rank 3 failed with exit code 1")
    with pytest.raises(RendezvousClosedError, match=r"failed \(rank 3 failed") as caught:
        await asyncio.wait_for(watch, 10)
    assert caught.value.exit_code == 1
    with pytest.raises(RendezvousClosedError):
        await handler(store, nodes=(2, 2)).next_rendezvous()
    await shutdown_all(a, b)


async def test_a_peers_success_does_not_end_a_running_round(store):
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    watch = asyncio.create_task(b.round_over())
    await a.set_closed(True, "done")
    await asyncio.sleep(0.2)
    assert not watch.done()  # b's workers may still be running
    watch.cancel()
    late = handler(store, nodes=(2, 2))
    with pytest.raises(RendezvousClosedError, match="the job succeeded") as caught:
        await late.next_rendezvous()
    assert caught.value.exit_code == 0
    await shutdown_all(a, b, late)


async def test_exit_barrier_waits_for_every_member(store):
    a, b = handler(store, nodes=(2, 2)), handler(store, nodes=(2, 2))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    first = asyncio.create_task(a.exit_barrier())
    await asyncio.sleep(0.1)
    assert not first.done()
    await asyncio.wait_for(asyncio.gather(first, b.exit_barrier()), 10)
    await shutdown_all(a, b)


async def test_a_round_ended_during_the_exit_barrier_is_said_and_waited_through(
    store, caplog, monkeypatch
):
    """A peer's workers failed after ours succeeded: the peer may finish the job in the next
    round, so the wait goes on until it closes the run, and the node says why it waits
    (it used to wait silently, up to the barrier timeout of 300 s)."""
    monkeypatch.setattr(exit_barrier, "CHECK", 0.2)
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2))
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    barrier = asyncio.create_task(a.exit_barrier())
    with caplog.at_level(logging.WARNING, logger="agentd.rendezvous.exit_barrier"):
        await b.end_round("its workers failed")
        info = await asyncio.wait_for(b.next_rendezvous(), 10)  # alone: at least one node
        assert (info.generation, info.group_world_size) == (1, 1)
        async with asyncio.timeout(10):
            while "round 0 ended while this node waited" not in caplog.text:
                await asyncio.sleep(0.01)
        assert not barrier.done()
        await b.exit_barrier()
        await b.set_closed(True, "the workers succeeded")
        await asyncio.wait_for(barrier, 10)  # the run is closed: nobody left to wait for
    await shutdown_all(a, b)


async def in_barrier(a: DynamicRendezvous, b: DynamicRendezvous) -> asyncio.Task[None]:
    """``a`` and ``b`` form a round, and ``a``'s workers succeeded: its exit barrier, once
    its ``done`` key is in (``b`` reads it as finished)."""
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    barrier = asyncio.create_task(a.exit_barrier())
    async with asyncio.timeout(10):
        while not await b.finished():
            await asyncio.sleep(0.01)
    return barrier


async def test_a_barrier_that_nobody_can_complete_ends_without_the_timeout(
    store, caplog, monkeypatch
):
    """Our workers succeeded; the peer's had not when it left for good: nobody will ever
    write its ``done`` key, nor close the run from a next round that nobody joined. The
    wait ends (it used to last the barrier timeout, 300 s, before the run was closed as
    succeeded all the same), and says why."""
    monkeypatch.setattr(exit_barrier, "CHECK", 0.2)
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2))
    barrier = await in_barrier(a, b)
    with caplog.at_level(logging.WARNING, logger="agentd.rendezvous.exit_barrier"):
        assert not barrier.done()
        await b.shutdown()  # gone for good, its workers not done
        await asyncio.wait_for(barrier, 10)
    assert "1 node(s) of round 0 left or were lost before their workers finished" in caplog.text
    await shutdown_all(a)


async def test_a_peer_lost_with_no_mark_ends_a_barrier_that_nobody_can_complete(
    store, caplog, monkeypatch
):
    """The peer's host was lost (its guardian with it), or its agent frozen past its lease,
    before its workers finished: nothing marks it gone, and nobody watched
    its heartbeat, since we wait in our barrier. We look at its lease there, count it gone
    once it lapsed, and leave: the barrier timeout (300 s) was waited out before."""
    monkeypatch.setattr(exit_barrier, "CHECK", 0.2)
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2), lapses=True)
    with caplog.at_level(logging.INFO, logger="agentd.rendezvous"):
        barrier = await in_barrier(a, b)
        assert b._membership is not None and b._rounds is not None
        await b._membership.stop()  # b's heartbeat stops, and nothing else happens
        b._rounds.release()
        await asyncio.wait_for(barrier, 20)
    assert f"node {b.node_id} of round 0 is gone (its lease is not held)" in caplog.text
    assert "1 node(s) of round 0 left or were lost before their workers finished" in caplog.text
    assert await store.get(f"agentd/job/round/0/gone/{b.node_id}") == b"lapsed"
    await shutdown_all(a)


async def test_a_barrier_waits_for_a_peer_whose_lease_holds(store, monkeypatch):
    """The peer's workers still work, its heartbeat beats: the barrier's looks at its lease
    count nothing gone, and the barrier ends when the peer's workers are done."""
    looks: list[tuple[int, bool]] = []

    class Counted(exit_barrier.SuccessorLeases):
        async def look(self, now: float) -> tuple[int, bool]:
            looks.append(await super().look(now))
            return looks[-1]

    monkeypatch.setattr(exit_barrier, "CHECK", 0.05)
    monkeypatch.setattr(exit_barrier, "SuccessorLeases", Counted)
    a, b = handler(store, nodes=(1, 2)), handler(store, nodes=(1, 2))
    barrier = await in_barrier(a, b)
    async with asyncio.timeout(10):
        while len(looks) < 5:
            await asyncio.sleep(0.01)
    assert set(looks) == {(0, False)} and not barrier.done()
    assert await store.get(f"agentd/job/round/0/gone/{b.node_id}") is None
    await asyncio.wait_for(asyncio.gather(barrier, b.exit_barrier()), 10)
    await shutdown_all(a, b)


async def test_the_members_whose_workers_succeeded_are_named_as_finished(store):
    """A node whose workers failed asks who will never run again before it restarts:
    those in their exit barrier (their ``done`` key), by group rank, never itself."""
    nodes = [handler(store, nodes=(3, 3)) for _ in range(3)]
    infos = await asyncio.wait_for(asyncio.gather(*(n.next_rendezvous() for n in nodes)), 10)
    by_rank = {info.group_rank: node for info, node in zip(infos, nodes, strict=True)}
    assert [await n.finished() for n in nodes] == [[], [], []]
    barrier = asyncio.create_task(by_rank[2].exit_barrier())
    async with asyncio.timeout(10):
        while await by_rank[0].finished() != [2]:
            await asyncio.sleep(0.01)
    assert await by_rank[1].finished() == [2]
    assert await by_rank[2].finished() == []  # its own key is not counted
    await by_rank[1].set_closed(False, "rank 1 failed")  # ends the barrier
    await asyncio.wait_for(barrier, 10)
    await shutdown_all(*nodes)


async def test_join_timeout_names_what_was_missing(store):
    lonely = handler(store, nodes=(2, 2), join_timeout=0.3)
    # (0 joined where a loaded machine let the timeout pass before its own arrival: -n 4
    # beside the simulation, 2026-12-02)
    with pytest.raises(RendezvousTimeoutError, match=r"[01] node\(s\) joined, 2..2 needed"):
        await lonely.next_rendezvous()
    await lonely.shutdown()


async def test_a_store_restart_mid_rendezvous_is_survived():
    server = StoreServer("127.0.0.1", 0)
    await server.start()
    port = server.port

    def over_http() -> DynamicRendezvous:
        async def open_store() -> OpenedStore:
            client = HttpStore(f"127.0.0.1:{port}", retry_timeout=20)
            return OpenedStore(client, client.close)

        conf = RendezvousSettings(min_nodes=2, max_nodes=2, **FAST)
        return DynamicRendezvous("restart", open_store, conf)

    a = over_http()
    waiting = asyncio.create_task(a.next_rendezvous())
    await server.store.wait(["agentd/restart/round/0/node/0"], 20)  # a joined; it waits
    await server.stop()  # everything the store knew is gone
    server = StoreServer("127.0.0.1", port)
    await server.start()
    b = over_http()
    try:
        infos = await asyncio.wait_for(asyncio.gather(waiting, b.next_rendezvous()), 20)
        assert sorted(i.group_rank for i in infos) == [0, 1]
    finally:
        with contextlib.suppress(Exception):
            await shutdown_all(a, b)
        await server.stop()


async def test_a_store_whose_host_starts_later_is_waited_for_at_the_first_rendezvous(caplog):
    """Node 1's agent started before node 0's, the store's host (a pod scheduled later): it
    waits, saying so, until the join timeout. It used to exit 3 once its store client gave
    up (30 s), where torchrun's agents wait 60 s and more; the heartbeat's warnings said
    its membership would lapse, though it had none, and it tried to leave a store it had
    never reached ("could not leave cleanly")."""
    caplog.set_level("INFO", logger="agentd.rendezvous")
    port = free_port()

    def over_http(join_timeout: float) -> DynamicRendezvous:
        async def open_store() -> OpenedStore:
            client = HttpStore(f"127.0.0.1:{port}", retry_timeout=0.3)  # gives up early
            where = f"127.0.0.1:{port}"
            return OpenedStore(client, client.close, remote=True, single_process=True, where=where)

        settings = {**FAST, "join_timeout": join_timeout}
        conf = RendezvousSettings(min_nodes=1, max_nodes=1, **settings)
        return DynamicRendezvous("late", open_store, conf)

    early = over_http(20)
    waiting = asyncio.create_task(early.next_rendezvous())
    await wait_for_log(caplog, "its host may not have started yet")
    assert "membership lapses" not in caplog.text
    server = StoreServer("127.0.0.1", port)
    await server.start()
    try:
        info = await asyncio.wait_for(waiting, 20)
        assert (info.group_rank, info.group_world_size) == (0, 1)
    finally:
        await early.shutdown()
        await server.stop()
    never = over_http(1.5)
    with pytest.raises(RendezvousTimeoutError, match="the store could not be reached"):
        await never.next_rendezvous()  # the same, with the store gone for good
    caplog.clear()
    await never.shutdown()
    assert "could not leave cleanly" not in caplog.text


async def test_a_round_short_of_its_minimum_says_what_it_waits_for(store, monkeypatch, caplog):
    from agentd.rendezvous import waiting

    monkeypatch.setattr(waiting, "FIRST_EVERY", 0.1)
    caplog.set_level("INFO", logger="agentd.rendezvous.waiting")
    lonely = handler(store, nodes=(2, 2))
    joining = asyncio.create_task(lonely.next_rendezvous())
    try:
        said = "round 0: 1 of 2..2 node(s) joined in "
        await wait_for_log(caplog, said)
        assert "waiting for at least 2 (join timeout in " in caplog.text
    finally:
        joining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await joining
        await shutdown_all(lonely)


async def test_the_first_member_back_names_the_members_not_back_yet(store, monkeypatch, caplog):
    """While a round waits, the first member of the last round back says who of that
    round is missing, by address and node id; a node gone for good is not named."""
    from agentd.rendezvous import waiting

    monkeypatch.setattr(waiting, "FIRST_EVERY", 0.1)
    caplog.set_level("INFO", logger="agentd.rendezvous.waiting")
    nodes = [handler(store, nodes=(2, 3), last_call_timeout=30.0) for _ in range(3)]
    await asyncio.gather(*(h.next_rendezvous() for h in nodes))
    await nodes[0].end_round("a worker failed")
    back = asyncio.create_task(nodes[0].next_rendezvous())  # the others stay away
    try:
        await wait_for_log(caplog, "not back yet from round 0: ")
        line = next(r.message for r in caplog.records if "not back yet" in r.message)
        absent = sorted(f"({h.node_id})" for h in nodes[1:])
        assert all(node in line for node in absent) and f"({nodes[0].node_id})" not in line
        assert "sealing at the last call in" not in line  # 1 of at least 2: no last call
    finally:
        back.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await back
        await shutdown_all(*nodes)


async def wait_for_log(caplog, text: str, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while text not in caplog.text:
        assert asyncio.get_running_loop().time() < deadline, caplog.text
        await asyncio.sleep(0.05)


async def test_a_place_given_by_a_store_we_moved_away_from_is_given_up(store, caplog):
    """A failover between ``add`` (the place) and writing the node entry: the place came
    from the old store, and the new one gave it to another node, whose entry is there.
    The joiner must not claim it too (two rank 0s, each waiting for the other forever)."""
    other = json.dumps(
        {"node": "other", "role": "default", "nproc": 1, "addr": "127.0.0.1", "port": 1}
    ).encode()
    await store.set("agentd/job/round/0/node/0", other)  # its place, as given by the old store
    await store.set("agentd/job/ctl/hb/other", b"1", ttl=60)  # and it is alive (S2)
    late = handler(store, nodes=(1, 2), last_call_timeout=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="agentd.rendezvous.rounds"):
            info = await asyncio.wait_for(late.next_rendezvous(), 20)
        assert "place 0 of round 0 is another node's" in caplog.text
        assert info.group_rank == 1  # the next place, not the taken one
    finally:
        await shutdown_all(late)


class Forgetful(MemoryStore):
    """A store that answers our next heartbeat 'expired', and then either still holds our
    round (it expired us) or, with ``lost_round``, no longer does (it restarted or failed
    over). Only ``get`` shows the loss, nothing changes under a watch and the round watch's
    reads (``multi_get``) see the old round: the heartbeat is what finds it, first."""

    def __init__(self, lost_round: bool) -> None:
        super().__init__()
        self.lost_round = lost_round
        self.forgot = False

    async def refresh(self, key: str, ttl: float) -> bool:
        return False if self.forgot else await super().refresh(key, ttl)

    async def get(self, key: str) -> bytes | None:
        if self.forgot and self.lost_round and "/node/" in key:
            return None
        return await super().get(key)

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return [await MemoryStore.get(self, key) for key in keys]


@pytest.mark.parametrize("lost_round", [False, True])
async def test_a_store_that_lost_the_round_is_said_at_info_an_expiry_at_warning(lost_round, caplog):
    """A store that failed over forgets our heartbeat and our round alike: what the design
    expects, said at INFO as the round watch says it (a WARNING there failed a chaos test
    that allows none, whenever the heartbeat reached the new store before the watch)."""
    store = Forgetful(lost_round)
    a = handler(store, nodes=(1, 1))
    await a.next_rendezvous()
    watch = asyncio.create_task(a.round_over())
    store.forgot = True
    with caplog.at_level(logging.INFO, logger="agentd.rendezvous.dynamic"):
        why = await asyncio.wait_for(watch, 10)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    if lost_round:
        assert why == "round 0 went with the store's old state (a restart or failover)"
        assert not warned
        assert any("our heartbeat went with it" in r.getMessage() for r in caplog.records)
    else:
        assert why.startswith("membership lost: ") and "had expired" in why
        assert [r.getMessage() for r in warned if "no longer a member" in r.getMessage()]
    await shutdown_all(a)


def test_a_lost_peer_is_named_by_its_address_with_its_id_beside_it():
    from agentd.agent.lost_peer import lost_node

    named = lost_node("node 10.0.0.3 (node3_16678_7c5933) left (no heartbeat)", 15.0)
    assert (named["node"], named["host"], named["agent_pid"]) == (
        "node3_16678_7c5933",
        "10.0.0.3",
        16678,
    )
    bare = lost_node("node node3_16678_7c5933 left (no heartbeat)", 15.0)  # an older agent's
    assert (bare["node"], bare["host"], bare["agent_pid"]) == ("node3_16678_7c5933", "node3", 16678)
