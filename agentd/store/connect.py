"""Opening the store a rendezvous runs on, and hosting it when this agent should.

Openers return an :class:`OpenedStore`, whose ``close`` also stops a server the agent
hosts. They run in the agent's loop, on the first rendezvous.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from agentd.exceptions import StartError
from agentd.store.api import Store
from agentd.store.memory import MemoryStore
from agentd.support.net import is_local_address, is_loopback

if TYPE_CHECKING:
    from agentd.store.candidacy import Candidacy
    from agentd.store.failover import FailoverStore
    from agentd.store.server import StoreServer
    from agentd.store.tls import StoreTls

log = logging.getLogger(__name__)


class OpenedStore(NamedTuple):
    """A store a rendezvous runs on, and how to let go of it."""

    store: Store
    close: Callable[[], Awaitable[None]]
    hosted: bool = False
    """This agent serves the store, so it must outlive the other agents' last requests."""
    remote: bool = False
    """The store lives in another process: this agent's membership is a lease on it."""
    single_process: bool = False
    """That process is one event loop (the embedded store, not etcd): a heartbeat it holds
    unanswered proves it frozen (see rendezvous/membership.py)."""
    where: str = "this agent"
    """The store's endpoint(s), for messages."""
    describe: Callable[[], dict[str, Any]] | None = None
    """What ``/status`` shows of the store (candidate lists only)."""
    prepare: Callable[[], Awaitable[str]] | None = None
    """Called before this agent's first round: where its candidate server stands by ('':
    nowhere), for its round entries (see :mod:`agentd.store.standby`)."""
    after_round: Callable[[Sequence[str]], None] | None = None
    """Called after each round this agent is in, with where the round's other members
    stand by (a member offers its candidate then)."""
    serving: Callable[[], bool] | None = None
    """This agent serves the store now, though it did not at first (a standby promoted)."""
    client_spec: Callable[[], dict[str, Any]] | None = None
    """How another process reaches the store as a client now (:func:`client_from_spec`):
    the guardian's release of a killed agent's membership."""
    on_candidates: Callable[[Callable[[], object]], None] | None = None
    """Register a call for the moment the store this agent serves admits a candidate (this
    agent's client, and so its ``client_spec``, knows the candidate by then)."""
    hand_over: Callable[[int], Awaitable[bool]] | None = None
    """Stop serving the store now, where another candidate can take it over and each of
    the round's N members (the argument) knows one: an agent that leaves a job that goes
    on (SIGTERM, a drain) lets the others fail over at once, before it counts itself gone
    there, instead of when it exits (a second restart for them). True if it did."""
    hand_down: Callable[[Sequence[str]], Awaitable[str]] | None = None
    """Hand the store this agent serves, state and all, to the first of the given
    candidates that takes it (:func:`agentd.store.succession.hand_down`): the endpoint
    that did, or ''. A store's host in its exit barrier, so that losing it there costs the
    others' round nothing."""
    stop_standing_by: Callable[[], Awaitable[None]] | None = None
    """Stop this agent's candidate server unless it serves (an agent told to stop, before
    its workers are: see :meth:`Standby.leave`)."""
    hosting: Candidacy | None = None
    """The candidacy of the seed this agent serves (a growing list's host): its list, kept
    across a restart of this agent, and asked by the restarted one (see
    :mod:`agentd.rendezvous.host_memory`)."""
    leaving: Callable[[], Awaitable[None]] | None = None
    """Called as this agent leaves: a search for the server that finds no candidate
    answering then gives up at once (see :meth:`FailoverStore.leave`), and this agent's
    candidate server stops unless it serves (see :meth:`Standby.leave`)."""

    @property
    def serves(self) -> bool:
        """This agent serves the store: it must outlive the other agents' last requests."""
        return self.serving() if self.serving is not None else self.hosted


StoreOpener = Callable[[], Awaitable[OpenedStore]]


def _connection_cap(workers: int) -> int:
    """The connections a store served by this agent may take: what it can spare beside
    its ``workers`` (see :mod:`agentd.support.fdlimits`)."""
    from agentd.store.wire import MAX_CONNECTIONS
    from agentd.support import fdlimits

    soft = fdlimits.raise_open_files_limit()
    reserve = fdlimits.worker_reserve(workers)
    return fdlimits.listener_cap(MAX_CONNECTIONS, soft, reserve, share=0.75)


async def open_memory_store() -> OpenedStore:
    """A store inside this agent: ``--standalone``, where no other agent could join."""
    store = MemoryStore(stall_guard=False)
    return OpenedStore(store, store.close)


def http_store_opener(
    host: str,
    port: int,
    token: str | None,
    is_host: bool,
    *,
    retry_timeout: float = 30.0,
    request_timeout: float = 10.0,
    failover_request_timeout: float | None = None,
    workers: int = 1,
    standby: bool = False,
    standby_host: str = "",
    tls: StoreTls | None = None,
) -> StoreOpener:
    """Open the embedded store at ``host:port``: serve it here when ``is_host`` and the port
    is free (another agent on this host may have bound it first); either way, be its
    client. A store served here takes at most the connections this agent can spare beside
    its ``workers`` (see :mod:`agentd.support.fdlimits`).

    The store is the seed of a growing candidate list (see :mod:`agentd.store.standby`):
    with ``standby``, this agent, once in a round, stands by on ``standby_host`` (''; the
    address it reaches the store from) to serve the store if its host is lost. Requests
    wait ``request_timeout`` for the seed alone, ``failover_request_timeout`` once there
    are candidates to move to. With ``tls``, every connection is TLS (:mod:`agentd.store.tls`)."""

    want_standby = standby

    async def open_store() -> OpenedStore:
        from agentd.store import succession
        from agentd.store.candidacy import Candidacy
        from agentd.store.client_spec import client_spec
        from agentd.store.failover import FailoverStore
        from agentd.store.standby import Standby
        from agentd.support.net import endpoint_text

        where = endpoint_text(host, port)
        server: StoreServer | None = None
        if is_host:
            from agentd.store.server import StoreServer  # aiohttp's server: hosts only

            candidacy = Candidacy((where,), 0, token or "", growing=True, tls=tls) if port else None
            server = StoreServer(
                host,
                port,
                token,
                max_connections=_connection_cap(workers),
                candidacy=candidacy,
                tls=tls,
            )
            try:
                await server.start()
            except StartError as exc:
                log.debug("Not hosting the store (%s); connecting to it instead", exc)
                server = None
            else:
                log.info("Hosting the rendezvous store on %s", server.endpoint)
                where = endpoint_text(host, server.port)
                if candidacy is not None:
                    candidacy.promote(1)
        client = FailoverStore(
            (where,),
            token if server is None else server.token,
            growing=True,
            retry_timeout=retry_timeout,
            request_timeout=failover_request_timeout or request_timeout,
            alone_request_timeout=request_timeout,
            tls=tls,
        )
        hosting = server.candidacy if server is not None else None
        if hosting is not None:  # our client knows a new candidate at once, and so our will
            client.own_candidate = where
            served = hosting
            served.admitted.append(lambda: client.adopt(served.endpoints, served.list_term))
        standby = None
        if want_standby and server is None:
            keeps_token = not token and is_loopback(host)  # the published token: the job's
            standby = Standby(
                client, standby_host, _connection_cap(workers), keeps_token=keeps_token
            )

        async def close() -> None:
            await client.close()
            if standby is not None:
                await standby.close()
            if server is not None:
                await server.stop()

        def describe() -> dict[str, Any]:
            serves = server or (standby.server if standby is not None else None)
            hosting = serves.candidacy if serves is not None else None
            return {**client.status(), "hosting": hosting and hosting.document()}

        def ours() -> StoreServer | None:
            return server or (standby.server if standby is not None else None)

        async def hand_over(members: int) -> bool:
            return await hand_over_store(ours(), client, members)

        async def hand_down(prefer: Sequence[str]) -> str:
            return await succession.hand_down(ours(), prefer)

        return OpenedStore(
            client,
            close,
            hosted=server is not None,
            remote=True,
            single_process=True,
            where=where,
            describe=describe,
            prepare=standby.prepare if standby else None,
            after_round=standby.after_round if standby else None,
            serving=lambda: serves_now(ours()),
            client_spec=lambda: client_spec(client),
            on_candidates=hosting.admitted.append if hosting is not None else None,
            hand_over=hand_over,
            hand_down=hand_down,
            stop_standing_by=standby.leave if standby else None,
            hosting=hosting,
            leaving=lambda: leave(client, standby.leave if standby else None),
        )

    return open_store


def candidates_opener(
    endpoints: Sequence[tuple[str, int]],
    token: str,
    is_host: bool | None,
    *,
    retry_timeout: float,
    request_timeout: float,
    workers: int = 1,
    tls: StoreTls | None = None,
    own_host: str | None = None,
) -> StoreOpener:
    """Open a store served by one of several candidates (see :mod:`agentd.store.candidates`).

    Unless ``is_host`` is False, this agent stands as the first candidate it can bind on
    this host (``is_host`` None: those whose address is this machine's; True: any), so
    two agents on one host take two candidates, or one and leave the rest; a candidate
    whose host is ``own_host`` (the agent's ``--local-addr``) is the only one it stands
    as. It is a client of whichever candidate serves, its own included, with a lease like
    any other."""

    async def open_store() -> OpenedStore:
        from agentd.store import succession
        from agentd.store.candidacy import Candidacy
        from agentd.store.client_spec import client_spec
        from agentd.store.failover import FailoverStore
        from agentd.store.server import StoreServer
        from agentd.support.net import endpoint_text

        texts = [endpoint_text(host, port) for host, port in endpoints]
        server: StoreServer | None = None
        own = [host for host, _ in endpoints if host == own_host]
        for index, (host, port) in enumerate(endpoints):
            if is_host is False or (is_host is None and not is_local_address(host)):
                continue
            if own and host != own_host:
                continue
            candidate = StoreServer(
                host,
                port,
                token,
                max_connections=_connection_cap(workers),
                candidacy=Candidacy(texts, index, token, tls=tls),
                tls=tls,
            )
            try:
                await candidate.start()
            except StartError as exc:
                log.debug("Not standing as store candidate %s (%s)", texts[index], exc)
                continue
            server = candidate
            log.info("Standing as store candidate %d of %d on %s", index, len(texts), texts[index])
            break
        client = FailoverStore(
            texts, token, retry_timeout=retry_timeout, request_timeout=request_timeout, tls=tls
        )
        if server is not None:
            client.own_candidate = server.candidacy.own if server.candidacy else ""

        async def close() -> None:
            await client.close()
            if server is not None:
                await server.stop()

        def describe() -> dict[str, Any]:
            hosting = server.candidacy if server is not None else None
            return {**client.status(), "hosting": hosting and hosting.document()}

        async def stop_standing_by() -> None:
            nonlocal server
            if server is not None and not (server.candidacy and server.candidacy.serving):
                await server.stop()  # as a standby's (see Standby.leave)
                server = None

        return OpenedStore(
            client,
            close,
            hosted=server is not None,
            remote=True,
            where=",".join(texts),
            describe=describe,
            client_spec=lambda: client_spec(client),
            hand_over=lambda members: hand_over_store(server, client, members),
            hand_down=lambda prefer: succession.hand_down(server, prefer),
            stop_standing_by=stop_standing_by,
            leaving=lambda: leave(client, stop_standing_by),
        )

    return open_store


async def leave(
    client: FailoverStore, stop_standing_by: Callable[[], Awaitable[None]] | None
) -> None:
    """What a leaving agent does to its store (see :attr:`OpenedStore.leaving`)."""
    client.leave()
    if stop_standing_by is not None:
        await stop_standing_by()


def serves_now(server: StoreServer | None) -> bool:
    """``server`` serves the store now (one without a candidacy always does)."""
    return server is not None and (server.candidacy is None or server.candidacy.serving)


async def hand_over_store(server: StoreServer | None, client: FailoverStore, members: int) -> bool:
    """Stop ``server`` if it serves the store and the candidate list is as long as the
    round (each of its ``members`` stood by, so each knows a candidate to move to; see
    :attr:`OpenedStore.hand_over`): from now on its port refuses, and every client, ours
    included, moves to the next candidate at its next request. A member that has not
    stood by yet knows only this server: then it is not stopped (False)."""
    from agentd.store.candidates import MAX_CANDIDATES

    candidacy = server.candidacy if server is not None else None
    if server is None or candidacy is None or not candidacy.serving:
        return False
    if len(client.endpoints) < max(2, min(members, MAX_CANDIDATES)):
        return False
    log.info(
        "Store %s: this agent leaves while the job goes on: handing the store over to "
        "the next candidate (the others fail over now, once)",
        server.endpoint,
    )
    await server.stop()
    return True
