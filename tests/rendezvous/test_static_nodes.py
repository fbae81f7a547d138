"""The static rendezvous of several nodes: agents on one event loop meet in node 0's real
store on 127.0.0.1, as agents on several hosts meet in it over the network."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from agentd.exceptions import ConfigError, StartError
from agentd.rendezvous.api import (
    HostsWorkersStore,
    RendezvousClosedError,
    RendezvousTimeoutError,
    agent_serves_store,
    fresh_store_each_attempt,
)
from agentd.rendezvous.static_claims import CLOSED, finished_key
from agentd.rendezvous.static_nodes import StaticNodesRendezvous
from tests.conftest import free_port


@pytest.fixture(autouse=True)
def quick_beats(monkeypatch):
    """A claim's beat, and a newcomer's watch of it, in tenths of a second."""
    from agentd.rendezvous import static_claims

    monkeypatch.setattr(static_claims, "BEAT_EVERY", 0.05)
    monkeypatch.setattr(static_claims, "JUDGE_AFTER", 0.3)


@pytest.fixture
async def nodes() -> AsyncIterator[list[StaticNodesRendezvous]]:
    """The handlers a test made (append them), shut down after it."""
    made: list[StaticNodesRendezvous] = []
    yield made
    for handler in reversed(made):
        await handler.shutdown()


def node(made: list, port: int, rank: int, nnodes: int, lws: int = 1, timeout: float = 30):
    handler = StaticNodesRendezvous(
        "job", "127.0.0.1", port, node_rank=rank, nnodes=nnodes, local_world_size=lws,
        timeout=timeout,
    )  # fmt: skip
    made.append(handler)
    return handler


async def met_pair(made: list, lws: int = 1, wait: float = 30):
    """Node 0 and node 1 (``lws`` workers, waiting ``wait`` seconds) of a job of 2, past
    round 0."""
    port = free_port()
    zero, one = node(made, port, 0, 2), node(made, port, 1, 2, lws=lws, timeout=wait)
    await asyncio.gather(zero.next_rendezvous(), one.next_rendezvous())
    return zero, one


async def test_nodes_of_different_sizes_meet_whoever_starts_first(nodes, monkeypatch, caplog):
    """The nodes started before node 0 wait for its store, and say so (they were silent)."""
    from agentd.rendezvous import static_meeting

    monkeypatch.setattr(static_meeting, "REPORT_EVERY", 0.1)
    caplog.set_level("INFO", logger="agentd.rendezvous")
    port = free_port()
    late_zero = node(nodes, port, 0, 3, lws=2)
    others = [node(nodes, port, 1, 3, lws=4), node(nodes, port, 2, 3, lws=1)]
    first = [asyncio.ensure_future(h.next_rendezvous()) for h in others]
    await asyncio.sleep(0.3)  # node 0 is not up yet: the others keep trying
    assert not any(f.done() for f in first)
    assert f"Waiting for node rank 0's agent to serve the job's store at 127.0.0.1:{port}" in (
        caplog.text
    )
    infos = await asyncio.wait_for(asyncio.gather(late_zero.next_rendezvous(), *first), 20)
    assert [info.group_rank for info in infos] == [0, 1, 2]
    for info in infos:
        assert [(r.rank, r.local_world_size) for r in info.role_infos] == [(0, 2), (1, 4), (2, 1)]
        assert (info.master_addr, info.master_port, info.generation) == ("127.0.0.1", port, 0)


async def test_a_node_that_restarts_ends_the_round_everywhere_and_all_meet_again(nodes):
    """Node 1's workers fail: its agent ends the round, node 0's sees it, and both meet
    at round 1, where node 0 has cleared the workers' keys before anyone's workers start."""
    from agentd.tcpstore.client import TCPStoreClient

    zero, one = await met_pair(nodes, lws=3)
    worker = await TCPStoreClient.connect("127.0.0.1", zero.master_port, 10)
    await worker.set("default_pg/0//rank_0", b"an address of round 0")  # a worker's key
    watching = asyncio.ensure_future(zero.round_over())
    await asyncio.sleep(0.2)
    assert not watching.done()
    await one.end_round("rank 1 failed with exit code 3")
    assert await asyncio.wait_for(watching, 10) == "rank 1 failed with exit code 3"
    again = await asyncio.wait_for(
        asyncio.gather(one.next_rendezvous(), zero.next_rendezvous()), 10
    )
    assert [info.generation for info in again] == [1, 1]
    assert [r.local_world_size for r in again[0].role_infos] == [1, 3]  # the claims, kept
    assert await worker.multi_get(["default_pg/0//rank_0"]) == [b""]
    from agentd.rendezvous.static_nodes import round_key

    said = await worker.multi_get([round_key(0, "over")])  # arriving kept the reason given
    assert said == [b"rank 1 failed with exit code 3"]
    await worker.close()


async def test_a_node_restarting_alone_waits_for_the_others(nodes):
    _, one = await met_pair(nodes, wait=0.5)
    with pytest.raises(RendezvousTimeoutError, match="not every node of --nnodes 2 restarted"):
        await asyncio.wait_for(one.next_rendezvous(), 10)


async def test_a_node_that_gives_up_closes_the_job_for_the_others(nodes):
    zero, one = await met_pair(nodes)
    watching = asyncio.ensure_future(zero.round_over())
    await one.set_closed(False, "rank 1 failed with exit code 3")
    with pytest.raises(RendezvousClosedError, match=r"another node ended the job \(rank 1 failed"):
        await asyncio.wait_for(watching, 10)


async def test_a_node_rank_taken_twice_is_a_config_error_naming_the_other_agent(nodes):
    port = free_port()
    zero, one = node(nodes, port, 0, 3), node(nodes, port, 1, 3)
    waiting = [asyncio.ensure_future(h.next_rendezvous()) for h in (zero, one)]
    second_one = node(nodes, port, 1, 3)
    with pytest.raises(ConfigError) as caught:
        await asyncio.wait_for(_after_claims(second_one, port, 2), 20)
    assert str(caught.value) == (
        f"--node-rank: 1 is taken by the agent on {os.uname().nodename} (pid {os.getpid()}): "
        "each node of a static job needs its own --node-rank in 0..2"
    )
    for future in waiting:
        future.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def _after_claims(handler: StaticNodesRendezvous, port: int, claims: int):
    """``handler``'s first round, once ``claims`` node ranks are claimed in the store."""
    from agentd.rendezvous.static_nodes import node_key
    from agentd.tcpstore.client import TCPStoreClient

    store = await TCPStoreClient.connect("127.0.0.1", port, 10)
    try:
        assert await store.wait([node_key(rank) for rank in range(claims)], 10)
    finally:
        await store.close()
    return await handler.next_rendezvous()


async def test_nodes_given_different_nnodes_are_told(nodes):
    port = free_port()
    zero, one = node(nodes, port, 0, 2), node(nodes, port, 1, 3)
    results = await asyncio.gather(
        asyncio.wait_for(zero.next_rendezvous(), 20),
        asyncio.wait_for(one.next_rendezvous(), 2),
        return_exceptions=True,
    )
    assert isinstance(results[0], ConfigError)
    assert str(results[0]) == (
        f"--nnodes: 2 here, but node rank 1 (on {os.uname().nodename}) was given 3: every "
        "node of a static job takes the same --nnodes"
    )
    assert isinstance(results[1], TimeoutError)  # it waits for a node rank 2 of its own


async def test_a_node_that_never_comes_is_named_when_the_wait_runs_out(nodes):
    port = free_port()
    zero = node(nodes, port, 0, 3, timeout=0.5)
    with pytest.raises(RendezvousTimeoutError) as caught:
        await asyncio.wait_for(zero.next_rendezvous(), 20)
    assert str(caught.value) == (
        f"static rendezvous: node rank(s) [1, 2] of --nnodes 3 did not join at "
        f"127.0.0.1:{port} within 0.5s (rdzv_conf timeout)"
    )


async def test_without_node_0_a_node_gives_up_after_the_timeout(nodes):
    port = free_port()
    with pytest.raises(RendezvousTimeoutError, match=rf"no store at 127.0.0.1:{port} within"):
        await asyncio.wait_for(node(nodes, port, 1, 2, timeout=0.3).next_rendezvous(), 20)


async def test_two_node_0s_on_one_host_are_told_at_the_port(nodes):
    port = free_port()
    first = asyncio.ensure_future(node(nodes, port, 0, 2).next_rendezvous())
    await asyncio.sleep(0.2)
    with pytest.raises(StartError, match="is another agent of this job on this host also"):
        await asyncio.wait_for(node(nodes, port, 0, 2).next_rendezvous(), 20)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first


async def test_the_exit_barrier_holds_node_0_until_every_node_is_done(nodes):
    zero, one = await met_pair(nodes)
    leaving = asyncio.ensure_future(zero.exit_barrier())
    await asyncio.sleep(0.3)
    assert not leaving.done()  # node 1's workers still run: its store must stay up
    await asyncio.wait_for(one.exit_barrier(), 10)
    await asyncio.wait_for(leaving, 10)


async def test_a_barrier_left_alone_by_node_0_ends(nodes):
    zero, one = await met_pair(nodes)
    waiting = asyncio.ensure_future(one.exit_barrier())
    await asyncio.sleep(0.2)
    await zero.shutdown()  # node 0's own barrier timed out, and it left
    await asyncio.wait_for(waiting, 10)


def test_it_serves_one_store_for_all_attempts_wherever_the_address_points():
    handler = StaticNodesRendezvous("job", "10.255.0.1", 29500, node_rank=0, nnodes=2)
    assert isinstance(handler, HostsWorkersStore) and handler.use_agent_store
    assert agent_serves_store(handler, "10.255.0.1")  # not an address here: still ours
    assert not fresh_store_each_attempt(handler, "10.255.0.1")


async def test_an_agent_that_leaves_before_the_end_gives_its_rank_to_the_next(nodes):
    """Node 1's agent is stopped (a signal: a pod deleted, preempted): node 0's round ends
    at once, and node 0 waits at the next one for an agent to take node rank 1, which one
    does at once (no beat to watch). Such a leave once closed the job on every node: a
    node preempted and made again found its job over."""
    zero, one = await met_pair(nodes, lws=2)
    watching = asyncio.ensure_future(zero.round_over())
    await one.shutdown()
    assert await asyncio.wait_for(watching, 10) == (
        "node rank 1's agent left; an agent may take its place"
    )
    waiting = asyncio.ensure_future(zero.next_rendezvous())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    new_one = node(nodes, zero.master_port, 1, 2, lws=2)
    infos = await asyncio.wait_for(asyncio.gather(waiting, new_one.next_rendezvous()), 10)
    assert [(i.group_rank, i.generation) for i in infos] == [(0, 1), (1, 1)]
    assert new_one._replacing.endswith(": it gave the rank back as it left")


async def test_an_agent_that_leaves_after_success_ends_nothing(nodes):
    zero, one = await met_pair(nodes)
    await asyncio.gather(zero.exit_barrier(), one.exit_barrier())
    await one.shutdown()
    assert await zero._store().multi_get([CLOSED]) == [b""]


async def killed(handler: StaticNodesRendezvous) -> None:
    """``handler``'s agent dies at once (SIGKILL): its beat stops and its connections
    drop, and it closes nothing."""
    assert handler._beat is not None and handler._client is not None
    handler._beat.cancel()
    await asyncio.gather(handler._beat, return_exceptions=True)
    await handler._client.close()
    await handler.job.close()
    handler._beat = handler._client = None


async def test_an_agent_started_again_after_a_kill_takes_its_rank_back(nodes, caplog):
    """Node 1's agent is SIGKILLed while its workers run, and started again: it takes node
    rank 1 over once its old self's beat stood still, ends round 0 (node 0's workers stop),
    and both meet at round 1 with the ranks placed as before. Its claim was refused as
    'taken' by the dead agent, and the refusal closed the job for node 0."""
    caplog.set_level("INFO", logger="agentd.rendezvous")
    zero, one = await met_pair(nodes, lws=2)
    await killed(one)
    watching = asyncio.ensure_future(zero.round_over())
    new_one = node(nodes, zero.master_port, 1, 2, lws=2)
    joining = asyncio.ensure_future(new_one.next_rendezvous())
    assert await asyncio.wait_for(watching, 10) == "node rank 1's agent was replaced"
    infos = await asyncio.wait_for(asyncio.gather(zero.next_rendezvous(), joining), 10)
    assert [(i.group_rank, i.generation) for i in infos] == [(0, 1), (1, 1)]
    assert [r.local_world_size for r in infos[1].role_infos] == [1, 2]
    assert "watching its beat" in caplog.text
    assert f"(pid {os.getpid()}): its beat stood still for 0.3s; meeting" in caplog.text


async def test_an_old_self_that_arrived_before_it_died_is_not_counted_twice(nodes):
    """Node 1's agent arrived at round 1 (its workers had failed) and was killed there.
    Its arrival stands for node rank 1, once: node 0 passes round 1 with it, or with the
    new agent, never with both counted while another node is still on its way."""
    port = free_port()
    zero, one, two = (node(nodes, port, rank, 3) for rank in range(3))
    await asyncio.gather(zero.next_rendezvous(), one.next_rendezvous(), two.next_rendezvous())
    await one.end_round("rank 1 failed with exit code 3")
    arriving = asyncio.ensure_future(one.next_rendezvous())
    from agentd.rendezvous.static_nodes import round_key
    from agentd.tcpstore.client import TCPStoreClient

    store = await TCPStoreClient.connect("127.0.0.1", port, 10)
    assert await store.wait([round_key(1, "here/1")], 10)
    arriving.cancel()
    await asyncio.gather(arriving, return_exceptions=True)
    await killed(one)
    new_one = node(nodes, port, 1, 3)
    zero_next = asyncio.ensure_future(zero.next_rendezvous())
    new_next = asyncio.ensure_future(new_one.next_rendezvous())
    await asyncio.sleep(1.0)  # node 2 has not stopped its workers yet: nobody may start
    assert not zero_next.done() and not new_next.done()
    infos = await asyncio.wait_for(asyncio.gather(zero_next, new_next, two.next_rendezvous()), 10)
    assert len({i.generation for i in infos}) == 1
    await store.close()


async def test_a_live_agent_keeps_its_rank_and_a_newcomer_leaves_the_job_alone(nodes):
    """A second agent given node rank 1 while the first beats is told (ConfigError), and
    its exit ends nothing: node 0's round goes on."""
    zero, _ = await met_pair(nodes)
    second = node(nodes, zero.master_port, 1, 2)
    with pytest.raises(ConfigError, match="--node-rank: 1 is taken by the agent on"):
        await asyncio.wait_for(second.next_rendezvous(), 10)
    watching = asyncio.ensure_future(zero.round_over())
    await second.shutdown()
    await asyncio.sleep(0.3)
    assert not watching.done()
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)


async def test_a_newcomer_with_another_worker_count_is_told(nodes):
    zero, one = await met_pair(nodes, lws=2)
    await killed(one)
    with pytest.raises(ConfigError) as caught:
        await asyncio.wait_for(node(nodes, zero.master_port, 1, 2, lws=4).next_rendezvous(), 10)
    assert str(caught.value) == (
        "--nproc-per-node: 4 here, but node rank 1 ran with 2 before this agent took its "
        "place: a node of a static job that comes back keeps its worker count and role"
    )


async def test_an_agent_judged_gone_finds_its_rank_taken_at_its_next_round(nodes):
    """A live agent whose beat stood still (frozen) lost its rank to a newcomer: at its
    next round it leaves, without closing the job that goes on with the newcomer."""
    zero, one = await met_pair(nodes)
    assert one._beat is not None
    one._beat.cancel()  # frozen: no beat, but its connection stays
    new_one = node(nodes, zero.master_port, 1, 2)
    joining = asyncio.ensure_future(new_one.next_rendezvous())
    await asyncio.wait_for(one.round_over(), 10)  # the newcomer ended round 0
    with pytest.raises(RendezvousClosedError, match="node rank 1 was taken over by the agent"):
        await asyncio.wait_for(one.next_rendezvous(), 10)
    await one.shutdown()
    infos = await asyncio.wait_for(asyncio.gather(zero.next_rendezvous(), joining), 10)
    assert [i.generation for i in infos] == [1, 1]


async def test_an_agent_started_again_after_its_workers_succeeded_has_nothing_to_run(nodes):
    zero, one = await met_pair(nodes)
    leaving = asyncio.ensure_future(zero.exit_barrier())
    await one._store().set(finished_key(1), b"1")  # its barrier, then the kill
    await killed(one)
    new_one = node(nodes, zero.master_port, 1, 2)
    with pytest.raises(RendezvousClosedError, match="workers had succeeded") as caught:
        await asyncio.wait_for(new_one.next_rendezvous(), 10)
    assert caught.value.succeeded
    await asyncio.wait_for(leaving, 10)  # node 0 waited for node 1's workers: they were done
    await new_one.shutdown()
    assert await zero._store().multi_get([CLOSED]) == [b""]


async def test_node_0_started_again_serves_a_new_store_where_the_others_meet_it(nodes):
    """Node 0's agent is killed, and with it the job's store: node 1's round ends, and
    node 1 waits for node 0's agent to serve a new store (it used to exit: 'lost the job's
    store'), then meets it there as at the first round, its generations going on."""
    zero, one = await met_pair(nodes, lws=2)
    port = zero.master_port
    watching = asyncio.ensure_future(one.round_over())
    await killed(zero)
    assert zero._server is not None
    await zero._server.stop()
    zero._server = None
    assert (await asyncio.wait_for(watching, 10)).startswith(
        f"the job's store at 127.0.0.1:{port} is gone"
    )
    waiting = asyncio.ensure_future(one.next_rendezvous())
    await asyncio.sleep(0.5)  # no store: node 1 waits for one
    assert not waiting.done()
    new_zero = node(nodes, port, 0, 2)
    again = await asyncio.wait_for(asyncio.gather(new_zero.next_rendezvous(), waiting), 20)
    assert [(i.group_rank, i.generation) for i in again] == [(0, 0), (1, 1)]
    assert [r.local_world_size for r in again[1].role_infos] == [1, 2]
    await one.job.publish(1, 1, {"node": "one"}, 10)  # the job view: one round, two numbers
    assert await new_zero.job.gather(0, 2) == ({1: {"node": "one"}}, 0)
    watching = asyncio.ensure_future(new_zero.round_over())
    await one.end_round("rank 1 failed with exit code 3")  # the rounds go on in the new store
    assert await asyncio.wait_for(watching, 10) == "rank 1 failed with exit code 3"
    again = await asyncio.wait_for(
        asyncio.gather(new_zero.next_rendezvous(), one.next_rendezvous()), 10
    )
    assert [i.generation for i in again] == [1, 2]


async def test_a_connection_lost_to_a_store_that_lives_on_resumes_its_rounds(nodes):
    """Node 1's connection to node 0's store breaks while the store lives on: node 1
    connects again, finds its claim there, and arrives at the next round as usual (not at
    a first round of its own, which nobody else would be at)."""
    zero, one = await met_pair(nodes)
    assert one._client is not None
    await one._client.close()  # reset: node 0 and its store are fine
    infos = await asyncio.wait_for(
        asyncio.gather(one.next_rendezvous(), zero.next_rendezvous()), 10
    )
    assert [i.generation for i in infos] == [1, 1]


async def test_an_agent_stopped_on_a_signal_ends_the_round_before_its_workers_stop(nodes):
    """``leaving_soon`` (the agent calls it before it stops its workers) gives the rank
    back and ends the round; the shutdown after it has nothing left to give."""
    zero, one = await met_pair(nodes)
    watching = asyncio.ensure_future(zero.round_over())
    await one.leaving_soon()
    assert await asyncio.wait_for(watching, 10) == (
        "node rank 1's agent left; an agent may take its place"
    )
    await one.shutdown()
    assert await zero._store().multi_get([CLOSED]) == [b""]


async def test_a_beat_goes_on_after_its_connection_drops(nodes):
    """The beat's connection breaks under a live agent: the next beat connects again, so a
    newcomer given the same rank still finds it held (a beat that stopped at the drop
    would have let it take a live agent's rank)."""
    zero, one = await met_pair(nodes)
    assert one.job._client is not None
    await one.job._client.close()  # dropped under it
    second = node(nodes, zero.master_port, 1, 2)
    with pytest.raises(ConfigError, match="--node-rank: 1 is taken by the agent on"):
        await asyncio.wait_for(second.next_rendezvous(), 10)


async def test_a_store_gone_between_a_watchs_two_connections_is_told_at_once(monkeypatch):
    """Node 0's store stops just after a round's watch made its first connection: the
    watch says so within a second or two, and closes that first connection (it used to
    retry the second for 10 s and then leave the first open)."""
    from agentd.rendezvous import static_claims
    from agentd.rendezvous.workers_store import store_server
    from agentd.tcpstore.client import TCPStoreClient

    server = store_server("127.0.0.1", 0, 1)
    await server.start()
    made: list[TCPStoreClient] = []
    real_connect = TCPStoreClient.connect

    async def connect_then_lose_the_store(host: str, port: int, retry_for: float):
        client = await real_connect(host, port, retry_for)
        made.append(client)
        await server.stop()  # node 0's agent dies after the first connection
        return client

    monkeypatch.setattr(TCPStoreClient, "connect", connect_then_lose_the_store)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError, match=r"no store at 127\.0\.0\.1"):
        await asyncio.wait_for(static_claims.first_of("127.0.0.1", server.port, "k", None), 9)
    assert loop.time() - began < 5
    assert len(made) == 1 and made[0]._writer.transport.is_closing()


async def test_a_connection_made_as_the_first_meeting_is_cancelled_is_closed(nodes, monkeypatch):
    """An agent stopped while it waits for node 0's store, just as its connection is made:
    the connection is closed, not left behind (the wait cancelled only a connect under
    way)."""
    from agentd.rendezvous.workers_store import store_server
    from agentd.tcpstore.client import TCPStoreClient

    server = store_server("127.0.0.1", 0, 1)
    await server.start()
    made: list[TCPStoreClient] = []
    real_connect = TCPStoreClient.connect
    meeting: asyncio.Task | None = None

    async def connect_as_the_agent_stops(host: str, port: int, retry_for: float):
        client = await real_connect(host, port, retry_for)
        made.append(client)
        assert meeting is not None
        meeting.cancel()  # SIGTERM: the agent's step is cancelled now
        return client

    monkeypatch.setattr(TCPStoreClient, "connect", connect_as_the_agent_stops)
    try:
        meeting = asyncio.ensure_future(node(nodes, server.port, 1, 2).next_rendezvous())
        with pytest.raises(asyncio.CancelledError):
            await meeting
        assert len(made) == 1 and made[0]._writer.transport.is_closing()
    finally:
        await server.stop()
