"""Failover in the protocol simulation: the store served by agent 0 as the seed of a
growing candidate list, every other agent standing by once it has been in a round, and a
lost, frozen or cut-off store host replaced by the first candidate that answers, as the
defaults do under Slurm and Kubernetes (:mod:`agentd.store.standby`).

What is real: every client's :class:`~agentd.store.failover.FailoverStore` (the agents'
and the guardians' releases), each server's
:class:`~agentd.store.server.StoreServer` answers (:meth:`StoreServer.answer`: the term
observed, the serving check, long polls cut short by a step-down, the candidate
operations) over its :class:`~agentd.store.candidacy.Candidacy` (terms, promotion, the
look for a successor, telling the others), the
:class:`~agentd.store.http_client.HttpStore` requests, encodings and revisions, and the
standby's offer (:class:`~agentd.store.standby.Standby`). What is modelled is HTTP
(:class:`Network`): a server runs in its agent's process, so SIGSTOP freezes it, SIGKILL
closes its port (connections refused, requests under way reset), and a lost host or a
partition leaves requests unanswered until TCP gives up (:data:`LIVENESS`) or the
request times out.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from agentd.rendezvous.accounting import CHECK_INTERVAL
from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.forgotten import lifetime
from agentd.store.api import StoreError, StoreOutcomeUnknown, StoreUnavailable
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import PROBE_TIMEOUT, Prober, RoleReport
from agentd.store.client_spec import client_spec
from agentd.store.connect import OpenedStore, hand_over_store, leave, serves_now
from agentd.store.failover import FailoverStore
from agentd.store.http_client import HttpStore
from agentd.store.retry import Backoff
from agentd.store.server import StoreServer
from agentd.store.sockets import LIVENESS
from agentd.store.standby import Standby
from agentd.store.succession import hand_down
from tests.sim.clock import answer_lost, spawn

if TYPE_CHECKING:
    from tests.sim.world import SimAgent, World

TOKEN = "sim-token"
PORT = 29400
RETRY_TIMEOUT = 30.0
"""The agents' store client: as ``rendezvous/build.py`` sets it with the defaults."""
ALONE_REQUEST_TIMEOUT = 10.0
FAILOVER_REQUEST_TIMEOUT = 5.0
"""min(read timeout, TTL / 3) with the defaults: a frozen server is left in time."""
RELEASE_TIMEOUT = 10.0
HOST_LOST_SLACK = 2.0


def store_host_lost_bound(settings: RendezvousSettings) -> float:
    """S3 for the store's host lost whole (agent and guardian): the others notice within a
    heartbeat interval and a request's timeout, probe the candidates, and fail over; the
    new store fences the round it forgot for one lease and the guardian's slack and fence
    (:func:`~agentd.rendezvous.forgotten.lifetime`); the first member back counts the
    rest gone at its next check (:data:`~agentd.rendezvous.accounting.CHECK_INTERVAL`)."""
    notice = settings.keep_alive_interval + FAILOVER_REQUEST_TIMEOUT + PROBE_TIMEOUT
    return notice + lifetime(settings.heartbeat_ttl) + CHECK_INTERVAL + HOST_LOST_SLACK


def host_of(agent: SimAgent) -> str:
    return f"10.0.0.{agent.host + 1}"


@dataclass
class Reply:
    """What came back to a request: an answer, or ``failure``: ``refused`` (nothing
    listens: never sent) or ``lost`` (no answer: it may have been applied)."""

    status: int = 0
    doc: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    failure: str = ""


class SimServer(StoreServer):
    """A candidate store server in ``agent``'s process, on the simulated network."""

    def __init__(self, network: Network, agent: SimAgent, port: int, candidacy: Candidacy) -> None:
        super().__init__(host_of(agent), port, TOKEN, candidacy=candidacy)
        self.network = network
        self.agent = agent
        self.closed = asyncio.Event()

    async def start(self) -> None:
        self.network.servers[self.endpoint] = self

    async def stop(self) -> None:
        self.closed.set()
        if self.network.servers.get(self.endpoint) is self:
            del self.network.servers[self.endpoint]
        await super().stop()

    def live(self, key: str) -> bool:
        return self.store._live(key) is not None


class Network:
    """Carries one request from a process on ``sender``'s host to the server listening at
    an endpoint, as TCP would: a seeded latency each way; refused where the host is up but
    nothing listens; unanswered where the host is lost or either side cut off (until TCP
    gives up, :data:`LIVENESS`, or ``answer_within``); reset at once when the server's process
    dies under it; waiting as long as it takes at a frozen one."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.servers: dict[str, SimServer] = {}

    def serves(self, agent: SimAgent) -> bool:
        """``agent`` serves the store now (its candidate was promoted last)."""
        return any(s.agent is agent and s.candidacy.serving for s in self.servers.values())  # type: ignore[union-attr]

    def can_serve(self, live: list[SimAgent]) -> bool:
        """S3's and S5's premise for the agents ``live``: one of their candidates serves,
        or one can be promoted: some agent reaches a candidate on another host (a client
        never promotes its own host's candidate alone: it may be the one cut off)."""
        servers = [s for s in self.servers.values() if s.agent in live]
        if any(s.candidacy is not None and s.candidacy.serving for s in servers):
            return True
        return any(s.agent is not agent for s in servers for agent in live)

    def stranded(self, agent: SimAgent) -> bool:
        """``agent`` has never been in a round, and no endpoint its client knows (the seed
        alone, until a store tells it the list) is a live server within its reach: it
        waits for the store until the join timeout, saying so, and then ``agentd run``
        exits 3 naming it. A node started as the store's host is lost, with an endpoint
        that names that host alone, cannot find the job."""
        opened = agent.handler._opened
        if agent.handler._joined_once or opened is None:
            return False
        known = getattr(opened.store, "endpoints", ())
        servers = [self.servers.get(endpoint) for endpoint in known]
        return not any(
            server is not None and not server.agent.owner.dead and self._reachable(agent, server)
            for server in servers
        )

    def _reachable(self, sender: SimAgent, server: SimServer) -> bool:
        if sender is server.agent:
            return True
        return not (sender.partitioned or server.agent.partitioned or server.agent.state == "lost")

    async def send(
        self,
        sender: SimAgent,
        endpoint: str,
        op: str,
        body: dict[str, Any],
        headers: dict[str, str],
        answer_within: float | None,
    ) -> Reply:
        world = self.world
        world.requests += 1
        sent = world.loop.time()
        await asyncio.sleep(world.latency())
        server = self.servers.get(endpoint)
        if server is None or server.agent.owner.dead:
            lost = server is not None and server.agent.state == "lost"
            if not lost and not sender.partitioned:
                return Reply(failure="refused")
            return await self._unanswered(sent, answer_within)
        if not self._reachable(sender, server):
            return await self._unanswered(sent, answer_within)
        if op in ("set", "refresh") and body.get("key") == sender.heartbeat_key:
            sender.delivered = max(sender.delivered, sent)
        raw = json.dumps(body).encode()
        named = {name.lower(): value for name, value in headers.items()}  # as HTTP hands them
        task = spawn(server.agent.owner, server.answer(op, raw, named), f"serve {op}")
        task.add_done_callback(answer_lost, context=contextvars.Context())
        ends = [server.closed.wait(), server.agent.down.wait()]
        if sender is not server.agent:  # loopback: no partition between a host and itself
            ends += [sender.cut.wait(), server.agent.cut.wait()]
        if answer_within is not None:
            ends.append(asyncio.sleep(max(0.0, sent + answer_within - world.loop.time())))
        waits = {asyncio.ensure_future(end) for end in ends}
        try:
            await asyncio.wait({task, *waits}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not task.done():
            gone = server.agent.owner.dead or server.closed.is_set()
            if gone and server.agent.state != "lost":
                return Reply(failure="lost")  # closed, or its kernel resets the connection
            return await self._unanswered(sent, answer_within)
        status, doc, answered = task.result()
        if op == "compare_set" and status == 200 and doc.get("succeeded"):
            desired = base64.b64decode(body["desired"])
            world.after_op(server, op, (body["key"], None, desired), (True, None))
        await asyncio.sleep(world.latency())
        if not self._reachable(sender, server):
            return await self._unanswered(sent, answer_within)
        return Reply(status, doc, answered)

    async def _unanswered(self, sent: float, answer_within: float | None) -> Reply:
        waited = LIVENESS if answer_within is None else min(LIVENESS, answer_within)
        await asyncio.sleep(max(0.0, sent + waited - self.world.loop.time()))
        return Reply(failure="lost")


class ServerLink(HttpStore):
    """:class:`HttpStore` over the :class:`Network`: its own requests, encodings, instance
    and revision bookkeeping; the network's failures sorted as aiohttp's are (refused:
    never sent; lost: it may have been applied)."""

    def __init__(self, network: Network, sender: SimAgent, endpoint: str, *args: Any, **kw: Any):
        super().__init__(endpoint, *args, **kw)
        self._network = network
        self._sender = sender

    async def _call(
        self,
        op: str,
        body: dict[str, Any],
        poll: float = 0.0,
        idempotent: bool = True,
        once: bool = False,
    ) -> dict[str, Any]:
        backoff = Backoff(0.0 if once else self._retry_timeout, *self._backoff)
        timeout = None if once else self._request_timeout + poll
        while True:
            if self._closed:
                raise StoreUnavailable(f"store at {self.url}: {op} after the client was closed")
            self.requests += 1
            endpoint = self.url.partition("://")[2]
            reply = await self._network.send(
                self._sender, endpoint, op, body, self._headers(), timeout
            )
            if not reply.failure:
                self._note_answer({key.lower(): value for key, value in reply.headers.items()})
                return self._answer(op, reply.status, reply.doc)
            if reply.failure == "refused" and self.refused_is_final:
                raise StoreUnavailable(f"store at {self.url}: connection refused")
            if reply.failure == "lost" and not idempotent:
                raise StoreOutcomeUnknown(f"store at {self.url}: {op} got no answer")
            if not await backoff.pause():
                raise StoreUnavailable(f"store at {self.url} is unreachable: {reply.failure}")


class SimProber(Prober):
    """:class:`Prober`, asking over the :class:`Network`."""

    def __init__(self, network: Network, sender: SimAgent, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._network = network
        self._sender = sender

    async def ask_at(
        self, index: int, endpoint: str, op: str, body: dict[str, Any], term: int
    ) -> RoleReport:
        if self._closed:
            return RoleReport(index, endpoint, problem="this client was closed")
        reply = await self._network.send(
            self._sender, endpoint, op, body, self.headers(term), PROBE_TIMEOUT
        )
        if reply.failure == "refused":
            problem = "cannot connect (Connection refused)"
            return RoleReport(index, endpoint, problem=problem, refused=True)
        if reply.failure:  # lost: it may have arrived
            why = "no answer within the probe timeout"
            return RoleReport(index, endpoint, problem=why, unsure=True)
        return self.report(index, reply.status, reply.doc, endpoint)

    async def close(self) -> None:
        self._closed = True


class SimStandby(Standby):
    """:class:`Standby`, listening on the simulated network."""

    def __init__(self, network: Network, agent: SimAgent, client: FailoverStore) -> None:
        super().__init__(client, host_of(agent), 0, prober=partial(SimProber, network, agent))
        self._network = network
        self._agent = agent

    async def _listen(
        self, host: str, port: int, candidacy: Candidacy, token: str
    ) -> StoreServer | None:
        server = SimServer(self._network, self._agent, port, candidacy)
        await server.start()
        candidacy.own = server.endpoint
        return server


def failover_client(
    network: Network, agent: SimAgent, endpoints: list[str], **timeouts: Any
) -> FailoverStore:
    """A client of the growing list ``endpoints`` from ``agent``'s host."""
    return FailoverStore(
        endpoints,
        TOKEN,
        growing=True,
        connect=partial(ServerLink, network, agent),
        prober=partial(SimProber, network, agent),
        **timeouts,
    )


async def open_store(network: Network, agent: SimAgent) -> OpenedStore:
    """As ``store/connect.py``'s ``http_store_opener`` opens it with the defaults: agent 0
    serves the seed under term 1; every agent is a client of the list, and the others
    stand by after each round."""
    seed = f"{host_of(network.world.agents[0])}:{PORT}"
    server: SimServer | None = None
    if agent.host == 0:
        candidacy = Candidacy(
            (seed,), 0, TOKEN, growing=True, prober=partial(SimProber, network, agent)
        )
        server = SimServer(network, agent, PORT, candidacy)
        await server.start()
        candidacy.promote(1)
    client = failover_client(
        network,
        agent,
        [seed],
        retry_timeout=RETRY_TIMEOUT,
        request_timeout=FAILOVER_REQUEST_TIMEOUT,
        alone_request_timeout=ALONE_REQUEST_TIMEOUT,
    )
    hosting = server.candidacy if server is not None else None
    if hosting is not None:
        client.own_candidate = seed
        served = hosting
        served.admitted.append(lambda: client.adopt(served.endpoints, served.list_term))
    standby = SimStandby(network, agent, client) if server is None else None

    async def close() -> None:
        await client.close()
        if standby is not None:
            await standby.close()
        if server is not None:
            await server.stop()

    return OpenedStore(
        client,
        close,
        hosted=server is not None,
        remote=True,
        single_process=True,
        where=seed,
        prepare=standby.prepare if standby else None,
        after_round=standby.after_round if standby else None,
        serving=lambda: serves_now(server or (standby and standby.server)),
        client_spec=lambda: client_spec(client),
        on_candidates=hosting.admitted.append if hosting is not None else None,
        hand_over=lambda members: hand_over_store(
            server or (standby and standby.server), client, members
        ),
        hand_down=lambda prefer: hand_down(server or (standby and standby.server), prefer),
        stop_standing_by=standby.leave if standby else None,
        hosting=hosting,
        leaving=lambda: leave(client, standby.leave if standby else None),
    )


def release_client(network: Network, agent: SimAgent, spec: dict[str, Any]) -> FailoverStore:
    """The store client of ``agent``'s guardian carrying out its will, from the will's
    spec, as ``store/connect.py``'s ``client_from_spec`` makes it."""
    return failover_client(
        network,
        agent,
        spec["endpoints"],
        start=spec["serving"],
        term=spec["term"],
        absent=spec["absent"],
        list_term=spec["list_term"],
        retry_timeout=RELEASE_TIMEOUT,
        request_timeout=RELEASE_TIMEOUT / 2,
        alone_request_timeout=RELEASE_TIMEOUT / 2,
    )


async def carry_out(
    network: Network, agent: SimAgent, will: dict[str, Any], said: Callable[[str], None]
) -> None:
    """The guardian's release of ``agent``'s membership through the store its will names."""
    from agentd.rendezvous.release import release

    store = release_client(network, agent, will["store"])
    try:
        said(await release(will, store))
    except (StoreError, TimeoutError) as exc:
        said(f"release failed: {type(exc).__name__} {exc}")
    finally:
        await store.close()
