"""A growing candidate list (one ``--rdzv-endpoint``): members stand by for the store's
host, over real HTTP on loopback addresses (127.0.0.2 and up bind like hosts)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.release import release
from agentd.rendezvous.round import RoundSettings
from agentd.store import candidacy as candidacy_module
from agentd.store.api import StoreNotServing, StoreUnavailable
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import MAX_CANDIDATES, fingerprint, replaces
from agentd.store.client_spec import client_from_spec, client_spec
from agentd.store.failover import FailoverStore
from agentd.store.server import StoreServer
from agentd.store.standby import Standby
from agentd.store.wire import CANDIDATE_COUNT_HEADER, CANDIDATES_HEADER
from tests.conftest import free_port

TOKEN = "secret"


class Job:
    """A seed server on 127.0.0.1 and the agents' clients, each standing by on 127.0.0.N."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seed = f"127.0.0.1:{self.port}"
        self.server: StoreServer | None = None
        self.clients: list[FailoverStore] = []
        self.standbys: list[Standby] = []

    async def start_seed(self) -> StoreServer:
        candidacy = Candidacy((self.seed,), 0, TOKEN, growing=True)
        self.server = StoreServer("127.0.0.1", self.port, TOKEN, candidacy=candidacy)
        await self.server.start()
        candidacy.promote(1)
        return self.server

    def client(self) -> FailoverStore:
        client = FailoverStore(
            (self.seed,),
            TOKEN,
            growing=True,
            retry_timeout=5.0,
            request_timeout=1.0,
            alone_request_timeout=2.0,
        )
        self.clients.append(client)
        return client

    async def member(self, number: int) -> tuple[FailoverStore, Standby]:
        """A member's client, once it has stood by (or been refused) on 127.0.0.number."""
        client = self.client()
        await client.set(f"hello/{number}", b"x")  # the first answer tells of the list
        standby = Standby(client, f"127.0.0.{number}", max_connections=64)
        self.standbys.append(standby)
        standby.start_soon()
        assert standby._task is not None
        await standby._task
        return client, standby

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for standby in self.standbys:
            await standby.close()
        if self.server is not None:
            await self.server.stop()


async def post(endpoint: str, op: str, body: dict, headers: dict[str, str]) -> tuple:
    """(status, JSON answer, headers) of one request."""
    headers = {"Authorization": f"Bearer {TOKEN}", **headers}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{endpoint}/v1/{op}", json=body, headers=headers) as response,
    ):
        return response.status, await response.json(), response.headers


@pytest.fixture
async def job():
    group = Job()
    await group.start_seed()
    yield group
    await group.close()


async def test_members_stand_by_on_the_seeds_port_and_every_client_learns_the_list(job):
    first, standby = await job.member(2)
    assert standby.server is not None
    assert standby.server.candidacy.own == f"127.0.0.2:{job.port}"
    second, _ = await job.member(3)
    expected = (job.seed, f"127.0.0.2:{job.port}", f"127.0.0.3:{job.port}")
    assert second.endpoints == expected
    await first.get("hello/2")  # an answer says the list is longer: one role request
    assert first.endpoints == expected
    assert standby.server.candidacy.endpoints == expected  # the standby follows its client
    assert not standby.serving


async def test_the_seed_lost_the_first_member_serves_under_term_2(job):
    first, standby = await job.member(2)
    second, _ = await job.member(3)
    await first.get("hello/2")
    await job.server.stop()
    job.server = None
    assert await second.get("hello/2") is None  # a new, empty store
    assert second.endpoints[second.serving] == f"127.0.0.2:{job.port}"
    assert second.term == 2 and second.failovers == 1
    await first.set("again", b"1")
    assert standby.serving and first.term == 2


async def test_a_restarted_seed_is_told_it_was_replaced_and_its_client_follows(job):
    first, standby = await job.member(2)
    await job.server.stop()
    await first.set("moved", b"1")  # promotes the member, which tells the others
    assert standby.serving
    restarted = await job.start_seed()  # serves an empty store under term 1 ...
    lone = job.client()
    await lone.set("alone", b"1")
    for _ in range(100):  # ... until the new server's next word (every 2 s)
        if not restarted.candidacy.serving:
            break
        await asyncio.sleep(0.05)
    assert restarted.candidacy.role == "standby" and restarted.candidacy.term == 2
    assert await lone.get("moved") == b"1"  # it learned the list, and went to the job
    assert lone.endpoints == first.endpoints and lone.term == 2


async def test_a_seed_that_asks_a_list_where_none_serves_a_newer_term_serves_on(job):
    """What a restarted store host does with the list its record kept (see
    rendezvous/host_memory.py), where the job lives nowhere else: a member standing by,
    one gone."""
    await job.member(2)
    gone = f"127.0.0.9:{free_port()}"
    assert not await job.server.candidacy.recall((*job.server.candidacy.endpoints, gone))
    assert job.server.candidacy.serving and job.server.candidacy.term == 1


async def test_a_killed_hosts_release_reaching_a_fresh_seed_reaches_the_job_too(job, monkeypatch):
    """A killed store host's guardian releases its membership through its will, whose
    client starts at the endpoint. A new node serving a fresh store there under term 1
    took the mark, and dropped it on stepping down to the job's candidate, whose round
    waited for the forgotten round's fence (``bench/bench_seed_back.py --new-host``:
    20 s). The release that reaches a store of another instance than its round's asks
    the list for a newer term, and releases there too."""
    monkeypatch.setattr(candidacy_module, "LOOK_EVERY", 60.0)  # nobody tells the new seed
    member, standby = await job.member(2)
    await member.get("hello/2")  # its client knows the list, and the seed's instance
    doc = {
        "run_id": "job",
        "node": "host",
        "round": [0, 2],
        "limits": list(RoundSettings(2, 3, 30.0, 600.0, 15.0)),
        "store": client_spec(member),  # the host's own client knew as much
        "instance": member.instance,
    }
    await job.server.stop()
    await member.set("moved", b"1")  # the job fails over to the member's candidate
    assert standby.serving and member.term == 2
    fresh = await job.start_seed()  # a new node at the endpoint, serving under term 1

    said = await release(json.loads(json.dumps(doc)))
    assert said == "released node host's membership of round 0 of run 'job'"
    gone = RunKeys("job").round(0, "gone")
    assert fresh.candidacy.serving and await fresh.store.get(gone) == b"1"  # reached first
    assert await member.get(gone) == b"1"  # and the job's store, where the round waits


async def test_a_restarted_seeds_fork_gives_way_to_the_list_served_under_a_newer_term(job):
    """The store's host restarted at the endpoint after a failover admits a new member
    to a fresh list, served under term 1, before the job's server tells it the term. Told,
    it takes the job's list (served under term 2) in place of its fork, and so does the
    new member's client, which goes to the job's server and offers its candidate there.
    Before, the fork was not a later version of the job's list: the seed stepped down
    knowing only the fork, the new member's client promoted it under term 3, and the
    job's server stepped down, its state dropped (``bench/bench_seed_back.py
    --both-lost``: 22 s)."""
    first, member = await job.member(2)
    await job.server.stop()
    await first.set("moved", b"1")  # promotes the member, under term 2
    job_list = first.endpoints
    assert member.serving and first.list_term == 2
    restarted = await job.start_seed()  # serves an empty store under term 1
    new, newcomer = await job.member(4)  # standing by in the fork, before the word comes
    assert newcomer.server is not None
    fork = (job.seed, newcomer.server.candidacy.own)
    assert new.endpoints == fork and restarted.candidacy.endpoints == fork
    for _ in range(100):  # the job's server tells the seed its term and list (every 2 s)
        if not restarted.candidacy.serving:
            break
        await asyncio.sleep(0.05)
    assert restarted.candidacy.endpoints == job_list and restarted.candidacy.list_term == 2
    assert await new.get("moved") == b"1"  # the job's store, its state kept
    assert member.serving and member.server.candidacy.term == 2
    assert not restarted.candidacy.serving and new.term == 2
    for _ in range(100):  # the new member offers its candidate again, to the job's server
        if newcomer.server.candidacy.index >= 0:
            break
        await asyncio.sleep(0.05)
    assert new.endpoints == (*job_list, newcomer.server.candidacy.own)
    assert member.server.candidacy.endpoints == new.endpoints


async def test_a_store_host_restarted_before_anyone_failed_over_is_told_the_list(job):
    """The store's host restarts at the endpoint before the members' clients look for
    another candidate: they reach its new store, which knows the seed alone, and the
    members, in the list already, offer nothing. The first answer's count says its list
    is shorter, so the client tells it the list; the seed's agent and its guardian then
    know the candidates to fail over to (seed 1819 of ``bench/simulate.py --failover
    --kinds ...,restart``: before, the restarted host's guardian knew none, 20 s)."""
    first, _ = await job.member(2)
    await job.member(3)
    await first.get("hello/2")  # the list of three
    job_list = first.endpoints
    await job.server.stop()
    restarted = await job.start_seed()  # back before anyone failed over
    assert restarted.candidacy.endpoints == (job.seed,)
    await first.set("after", b"1")  # the new store, under term 1
    assert first.serving == 0 and first.term == 1
    assert restarted.candidacy.endpoints == job_list
    assert await first.get("after") == b"1"  # told once: the requests go on as before


@pytest.mark.parametrize("members", [1, 2])
async def test_a_restarted_seeds_fork_of_the_same_term_merges_into_the_jobs_list(job, members):
    """The store's host restarts at the endpoint before anyone failed over, and a new
    member stands by in its fresh list, served under term 1 as the job's is, before a
    client of the job reaches it. Told the job's list, the seed serves the merge (the
    job's list, then its own entries) and every client takes it, so when the seed is lost
    again they all promote one candidate. Before, neither list replaced the other: the
    job's clients promoted 127.0.0.2 and the new member's client its own candidate, two
    stores serving term 2, neither seeing the other's writes. With one member the two
    lists are as long as each other: the answers' list fingerprint tells them apart."""
    first, _ = await job.member(2)
    if members == 2:
        await job.member(3)
    await first.get(f"hello/{members + 1}")
    job_list = first.endpoints
    await job.server.stop()
    restarted = await job.start_seed()  # back at once: nobody failed over
    new, newcomer = await job.member(4)  # standing by in the fresh list first
    assert newcomer.server is not None
    fork = (job.seed, newcomer.server.candidacy.own)
    assert restarted.candidacy.endpoints == new.endpoints == fork
    await first.set("after", b"1")  # the job's client tells the seed its list
    merged = (*job_list, newcomer.server.candidacy.own)
    assert restarted.candidacy.endpoints == first.endpoints == merged
    await new.set("mine", b"1")  # the new member's client takes the merge
    assert new.endpoints == merged and newcomer.server.candidacy.index == len(job_list)
    await restarted.stop()  # lost again: one candidate is promoted, by both
    await first.set("x", b"1")
    await new.set("y", b"1")
    assert first.endpoints[first.serving] == new.endpoints[new.serving] == job_list[1]
    assert await first.get("y") == b"1" and await new.get("x") == b"1"


def test_a_list_served_under_a_newer_term_replaces_a_fork_only():
    """Which version of a growing list replaces which (see ``candidates.replaces``)."""
    job_list, fork = ("s", "a", "b"), ("s", "x")
    assert replaces(fork, 1, job_list, 2) and not replaces(job_list, 2, fork, 1)
    assert not replaces(fork, 2, job_list, 2)  # forks of one term: neither knows better
    merged = (*job_list, "x")
    assert replaces(fork, 1, merged, 1) and replaces(job_list, 1, merged, 1)  # the merge
    assert not replaces(merged, 1, fork, 1) and not replaces(fork, 1, ("s", "a", "y"), 1)
    assert replaces(("s",), 0, job_list, 0)  # a later version, under any term
    assert not replaces(job_list, 1, ("s", "a"), 3)  # an earlier version of ours: ours stays
    assert not replaces(job_list, 1, job_list, 3)


async def test_a_heartbeat_told_the_seed_stands_by_moves_its_lone_client_at_once(job):
    """A restarted host's client knows only the seed, its own stepped-down store. Its
    heartbeat, the first request to fail there, starts the search for the server, so the
    next heartbeat reaches the job's (before, it waited for another request: heartbeats
    failed twice, and the second said WARNING)."""
    first, _ = await job.member(2)
    await job.server.stop()
    await first.set("moved", b"1")
    restarted = await job.start_seed()
    lone = job.client()
    await lone.set("mine", b"1")
    for _ in range(100):
        if not restarted.candidacy.serving:
            break
        await asyncio.sleep(0.05)
    assert restarted.candidacy.role == "standby"
    with pytest.raises(StoreNotServing):
        await lone.heartbeat("mine", 5.0)
    for _ in range(100):  # no other request is made meanwhile
        if lone.failovers:
            break
        await asyncio.sleep(0.05)
    assert lone.endpoints[lone.serving] == f"127.0.0.2:{job.port}" and lone.term == 2
    assert await lone.heartbeat("moved", 5.0) is True  # only the job's server holds it


async def test_a_search_that_steps_the_restarted_seed_down_teaches_it_the_list(job):
    """A client that has seen term 2 and looks for the server asks the restarted seed
    too: the seed steps down and learns the list from that one request, so its own lone
    client follows at its first failed heartbeat. Before, the list came with the new
    server's next word, up to 2 s later (a chaos test saw heartbeats fail twice
    meanwhile, the second a WARNING)."""
    first, member = await job.member(2)
    await job.server.stop()
    await first.set("moved", b"1")  # promotes the member, under term 2
    assert member.server is not None and member.server.candidacy._telling is not None
    member.server.candidacy._telling.cancel()  # its word to the seed comes too late here
    restarted = await job.start_seed()
    lone = job.client()
    await lone.set("mine", b"1")
    assert restarted.candidacy.serving and restarted.candidacy.endpoints == (job.seed,)
    await first._find_server(first._moves, "a search")  # one round of role requests
    assert restarted.candidacy.role == "standby" and restarted.candidacy.term == 2
    assert restarted.candidacy.endpoints == first.endpoints
    with pytest.raises(StoreNotServing):
        await lone.heartbeat("mine", 5.0)
    for _ in range(40):
        if lone.failovers:
            break
        await asyncio.sleep(0.05)
    assert lone.endpoints[lone.serving] == f"127.0.0.2:{job.port}" and lone.term == 2


async def test_a_member_that_knows_the_seed_alone_finds_the_job_through_a_peer(job):
    """The store's host admitted the member and was lost before its answer (or before the
    member asked): it knows the seed alone. A peer of its round, asked once the seed fails,
    shows the list, and it moves to the job's new server (before, it asked the dead seed
    until its join timeout, and a job short of MIN without it never re-formed)."""
    lone = job.client()
    await lone.set("hello/9", b"x")  # the seed's list was the seed alone then
    first, member = await job.member(2)
    assert lone.alone and not first.alone
    lone.peers = (member.endpoint,)
    await job.server.stop()
    job.server = None
    await first.set("moved", b"1")  # promotes the member, under term 2
    with pytest.raises(StoreUnavailable):
        await lone.heartbeat("hello/9", 5.0)  # one attempt at the dead seed: the search begins
    for _ in range(100):
        if lone.failovers:
            break
        await asyncio.sleep(0.05)
    assert lone.endpoints == first.endpoints and lone.term == 2
    assert await lone.get("moved") == b"1"


async def test_a_lone_request_asks_the_peers_once_the_seed_is_given_up(job):
    """The same through a request: a lone client retries the seed for its retry timeout,
    then asks its peers before it fails."""
    lone = FailoverStore((job.seed,), TOKEN, growing=True, retry_timeout=1.0)
    job.clients.append(lone)
    await lone.set("hello/9", b"x")
    first, member = await job.member(2)
    await job.server.stop()
    job.server = None
    await first.set("moved", b"1")
    with pytest.raises(StoreUnavailable):  # no peer: as before
        await lone.get("moved")
    lone.peers = (f"127.0.0.9:{job.port}", member.endpoint)  # one peer gone, one there
    assert await lone.get("moved") == b"1"
    assert lone.endpoints == first.endpoints and lone.failovers == 1


async def test_a_member_listens_and_offers_before_its_first_round(job):
    """Its endpoint goes into its round entries, so it listens before it is in a round,
    and it offers at once: admitted while its first round forms, it knows a list to fail
    over with even where the host is lost as that round is sealed (seeds 39566 and 54457
    of ``bench/simulate.py --failover``, where every member heard its answer too late and
    knew the seed alone)."""
    client = FailoverStore((job.seed,), TOKEN, growing=True, retry_timeout=1.0)
    job.clients.append(client)
    standby = Standby(client, "127.0.0.2", max_connections=64)
    job.standbys.append(standby)
    await client.set("hello", b"x")  # the seed's first answer: it keeps a list
    endpoint = await standby.prepare()
    assert endpoint == f"127.0.0.2:{job.port}" and await standby.prepare() == endpoint
    assert standby._task is not None
    await standby._task
    assert client.endpoints == (job.seed, endpoint)
    standby.after_round([])
    assert standby._task.done()  # admitted: nothing more to offer


async def test_an_offer_whose_answer_was_lost_is_made_again_after_the_next_round(job):
    """Meanwhile the server answers the peers' questions with the client's list."""
    client = FailoverStore((job.seed,), TOKEN, growing=True, retry_timeout=1.0)
    job.clients.append(client)
    standby = Standby(client, "127.0.0.2", max_connections=64)
    job.standbys.append(standby)
    await client.set("hello", b"x")
    await job.server.stop()  # lost before the member's offer
    job.server = None
    endpoint = await standby.prepare()
    assert standby._task is not None
    await standby._task  # the offer fails: the seed is gone
    asked = {CANDIDATES_HEADER: fingerprint([job.seed])}
    _, doc, _ = await post(endpoint, "role", {}, asked)
    assert doc["role"] == "standby" and doc["endpoints"] == [job.seed]
    assert standby.server is not None and not client.peers
    await job.start_seed()  # back, empty: the next round's offer is admitted
    standby.after_round([f"127.0.0.3:{job.port}"])
    await standby._task
    assert client.endpoints == (job.seed, endpoint)
    assert client.peers == (f"127.0.0.3:{job.port}",)
    standby.after_round([])
    assert standby._task.done()  # admitted: nothing more to offer


@pytest.fixture
def no_contact_rounds(monkeypatch):
    """The serving candidate's asks of the cut-off rule, held off for an hour (set before
    the seed starts: its first round of asks is timed as it is promoted)."""
    monkeypatch.setattr(candidacy_module, "CONTACT_EVERY", 3600.0)


async def test_a_search_asks_a_silent_candidate_once_when_the_list_grows(no_contact_rounds, job):
    """A search whose answers show a longer list asks every candidate again but those
    that did not answer in time: one on a lost host costs its probe timeout once per
    search, not once per version of the list (seed 2929 of ``bench/simulate.py
    --failover`` paid it twice: 4.1 s); the others are asked again, since an answer from
    before a partition would pass for a sign that this host is not cut off (seed 5548).
    The serving seed's own asks (the cut-off rule, once the list holds three) are held
    off, so the silent host counts the client's alone."""
    connections = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read()  # never answers: the host behind it is lost
        writer.close()

    lost = await asyncio.start_server(silent, "127.0.0.3", 0)
    asked = {CANDIDATES_HEADER: fingerprint([job.seed])}
    try:
        lost_endpoint = f"127.0.0.3:{lost.sockets[0].getsockname()[1]}"
        await post(job.seed, "stand", {"endpoint": lost_endpoint}, asked)
        client = job.client()
        await client.set("hello", b"x")  # learns the list of two
        assert client.endpoints == (job.seed, lost_endpoint)
        later = f"127.0.0.4:{free_port()}"
        await post(job.seed, "stand", {"endpoint": later}, asked)  # a third, unknown to it
        await client._find_server(client._moves, "a search")
        assert client.endpoints == (job.seed, lost_endpoint, later)
        assert connections == 1
        assert client.failovers == 0  # the seed serves still
    finally:
        lost.close()


async def test_the_list_stops_growing_at_its_limit(job):
    members = [await job.member(number) for number in range(2, MAX_CANDIDATES + 2)]
    admitted = [standby for _, standby in members if standby.server is not None]
    assert len(admitted) == MAX_CANDIDATES - 1
    last_client, last = members[-1]
    assert last.server is None  # refused, or not tried: the list was full
    assert len(last_client.endpoints) == MAX_CANDIDATES


async def test_a_plain_store_has_no_list_and_nobody_stands_by():
    port = free_port()
    server = StoreServer("127.0.0.1", port, TOKEN)
    await server.start()
    client = FailoverStore((f"127.0.0.1:{port}",), TOKEN, growing=True, retry_timeout=2.0)
    standby = Standby(client, "127.0.0.2", max_connections=64)
    try:
        await client.set("k", b"v")
        standby.start_soon()
        await standby._task
        assert standby.server is None and client.alone
        _, doc, _ = await post(f"127.0.0.1:{port}", "role", {}, {})
        assert doc == {"role": "serving", "term": 0}
    finally:
        await standby.close()
        await client.close()
        await server.stop()


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"endpoint": "nohost"}, 200, ""),  # a host with the default port is an endpoint
        ({"endpoint": "a:b"}, 400, "endpoint: 'a:b' has no valid port"),
        ({"endpoint": "a:0"}, 400, "endpoint: 'a:0' must be host:port with a fixed port"),
        ({"endpoint": 7}, 400, "endpoint: '' must be host:port"),
        ({}, 400, "endpoint: '' must be host:port"),
    ],
)
async def test_stand_checks_the_endpoint(job, body, status, error):
    headers = {CANDIDATES_HEADER: fingerprint([job.seed])}
    answered, doc, sent = await post(job.seed, "stand", body, headers)
    assert answered == status, doc
    assert doc.get("error", "").startswith(error), doc
    if status == 200:
        assert sent[CANDIDATE_COUNT_HEADER] == "2"


async def test_the_answer_to_stand_lists_the_member_it_admitted(job):
    """The answer was built before the admission: a member learned a list without itself
    (it logged "candidate -1") and, the store's host lost before its next answer, had no
    candidate to move to while the others re-formed without it."""
    headers = {CANDIDATES_HEADER: fingerprint([job.seed])}
    _, doc, _ = await post(job.seed, "stand", {"endpoint": "127.0.0.9:4000"}, headers)
    assert doc["admitted"] and doc["endpoints"] == [job.seed, "127.0.0.9:4000"], doc


async def test_a_member_knows_the_list_with_itself_as_soon_as_it_stands_by(job):
    client = job.client()
    await client.set("hello", b"x")
    client._learning = True  # no other request teaches it the list meanwhile
    standby = Standby(client, "127.0.0.2", max_connections=64)
    job.standbys.append(standby)
    standby.start_soon()
    assert standby._task is not None
    await standby._task
    assert standby.server is not None and standby.server.candidacy.index == 1
    assert client.endpoints == (job.seed, f"127.0.0.2:{job.port}")
    assert not client.alone  # the seed lost, it moves on instead of retrying it for 30 s


async def test_a_client_of_another_seed_is_refused(job):
    other = fingerprint(["127.0.0.9:1"])
    status, doc, _ = await post(job.seed, "get", {"key": "k"}, {CANDIDATES_HEADER: other})
    assert status == 409 and "another list" in doc["error"]


async def test_a_closed_client_fails_at_once_and_opens_no_connection_again(job):
    first, _ = await job.member(2)
    await first.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await asyncio.wait_for(first.get("hello/2"), timeout=2.0)
    assert first._client._connections is None and first._prober._clients == {}


async def test_a_node_with_a_ca_but_no_certificate_says_why_it_cannot_stand_by(tmp_path, caplog):
    from agentd.store.tls import StoreTls
    from tests.helpers.tls import make_ca

    ca = make_ca(tmp_path)
    tls = StoreTls(str(ca), None, None)  # verifies the store; cannot serve it
    client = FailoverStore(("127.0.0.1:1",), TOKEN, growing=True, tls=tls)
    try:
        standby = Standby(client, "127.0.0.2", max_connections=64)
        candidacy = Candidacy(("127.0.0.1:1",), None, TOKEN, growing=True)
        assert await standby._listen("127.0.0.2", free_port(), candidacy, TOKEN) is None
    finally:
        await client.close()
    [line] = [r for r in caplog.records if "cannot stand by" in r.getMessage()]
    assert line.levelname == "WARNING"
    assert "cert=: required to serve the store over TLS" in line.getMessage()
    assert "no port to listen on" not in caplog.text


def test_a_socket_option_the_host_refuses_is_said_once(monkeypatch, caplog):
    import socket

    from agentd.store import sockets

    class Refusing(socket.socket):
        def setsockopt(self, level, option, value, *rest):
            if option == getattr(socket, "TCP_USER_TIMEOUT", None):
                raise OSError(92, "Protocol not available")
            return super().setsockopt(level, option, value, *rest)

    monkeypatch.setattr(sockets.socket, "socket", Refusing)
    monkeypatch.setattr(sockets, "_refused", set())
    info = socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0]
    for _ in range(2):
        sockets.keepalive_socket(info).close()
    [line] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert line.levelname == "WARNING" and "TCP_USER_TIMEOUT=3000 refused" in line.getMessage()


async def test_a_member_standing_by_knows_the_term_the_seed_serves_under(job):
    """Asked for its role, it says term 1: a client that knows no term (a guardian's,
    say) then promotes above the seed's, not beside it."""
    _, standby = await job.member(2)
    assert standby.server is not None and standby.server.candidacy.term == 1


async def test_a_client_made_from_a_spec_promotes_above_the_term_its_agent_saw(job):
    """A killed agent's guardian releases it through a client made from its spec; with the
    seed out of reach (frozen, say), it promotes a member under term 2. Under term 1, as
    it once did, the frozen seed kept serving once it resumed (it wins a tie), beside the
    member promoted, and the job was split between the two (seed 10409 of
    ``bench/simulate.py --failover``)."""
    first, standby = await job.member(2)
    spec = client_spec(first)
    assert spec["term"] == 1
    await job.server.stop()
    job.server = None
    guardian = client_from_spec(spec, 5.0)
    job.clients.append(guardian)
    standby.server.candidacy.term = 0  # as a member that stood by before this fix knew it
    await guardian.set("released", b"1")
    assert standby.serving and standby.server.candidacy.term == 2 and guardian.term == 2


async def test_a_spec_carries_the_candidates_named_silent_and_a_spec_without_them_reads():
    """A guardian's client starts knowing the candidates its agent's server named silent
    (its search does not wait for them); a will written by an older agentd, without
    them, or with junk in their place, reads as naming none."""
    endpoints = ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]
    client = FailoverStore(endpoints, TOKEN, growing=True, absent=[2])
    spec = client_spec(client)
    made = [client]
    try:
        assert spec["absent"] == [2]
        made.append(client_from_spec(spec, 5.0))
        assert made[-1].absent == {2}
        for absent, read in ((None, set()), ("2", set()), ([None, "x", 1], {1})):
            older = {key: value for key, value in spec.items() if key != "absent"}
            made.append(
                client_from_spec(older if absent is None else {**older, "absent": absent}, 5.0)
            )
            assert made[-1].absent == read
    finally:
        for one in made:
            await one.close()
