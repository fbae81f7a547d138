"""FailoverStore: the Store protocol over a list of candidate servers, one serving at a time.

It finds the candidate serving (:mod:`agentd.store.candidates`) on its first request and
keeps talking to it (one probe of each candidate at start). When the server stops
answering, or stands by, the client asks every candidate its role, moves to the one
serving under the newest term or promotes the lowest-index one that answers, and sends the
request again there (except an ``add`` that may have been applied). It waits for every
answer, each within the probe timeout, but for those of candidates the server had not
heard lately (on a host lost earlier: :mod:`agentd.store.contact`), once the others are
in. The new server starts empty, unless the old one handed it the state
(:mod:`agentd.store.succession`: a "Store moved" line, where a loss logs "Store failover"):
the next watch answers ``compacted``, and the rendezvous reads its round again there.

With a growing list (``growing``; see :mod:`agentd.store.standby`), it starts with the
seed alone and talks to it as to a single store. Every answer says how long the server's
list is; when it is longer than ours, one ``role`` request fetches it, and from then on a
lost server is failed over as above. Its role and promote requests carry the list.

A list's only copy may be lost with the store's host: a member that the host admitted in
its last milliseconds, or one that had not asked yet, knows the seed alone. So the client
also knows its **peers**: where the other members of its last round stand by (their
candidate servers, each listening from before its first round, and each told its
client's list). When no candidate of our list serves, or can, and a peer outside it
shows a later version of the list, that version is ours, and the search goes on there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentd.store.api import StoreLeft, StoreNotServing, StoreOutcomeUnknown, StoreUnavailable
from agentd.store.candidates import Prober, RoleReport, endpoint_list, list_fingerprint, list_term
from agentd.store.forwarding import ForwardingStore
from agentd.store.http_client import HttpStore
from agentd.store.retry import Backoff
from agentd.store.wire import CANDIDATES_HEADER, TERM_HEADER
from agentd.support.aio import cancel_and_wait

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_RETRY = 1.0
"""Seconds one server's connection failures are retried before the others are asked (a
refused connection is not retried: nothing listens there any more)."""
STARTUP_GRACE = 5.0
"""At the first request, how long lower-index candidates that do not answer yet are waited
for before a higher one is promoted (agents and stores start in any order)."""


class FailoverStore(ForwardingStore):
    """A client of the candidates at ``endpoints`` (host:port, in their order).

    ``retry_timeout``: how long to look for a serving candidate before a request fails
    with :class:`StoreUnavailable`, naming every candidate and why it did not serve.

    ``growing``: ``endpoints`` is the seed of a growing list; until it grows, requests go
    to the seed as to a lone store, each with ``alone_request_timeout``.

    ``connect`` and ``prober`` make the client of one server and the prober of them all
    (the protocol simulation's carry its requests over its own network). ``start``: the
    index of the candidate another client found serving (a guardian's release goes
    there first, not to a seed that may be the host just lost), and ``term`` the newest
    term that client had seen: a failover promotes above it, never beside a server that
    is only frozen (seed 10409 of ``bench/simulate.py --failover``); ``absent``, the
    candidates the server had last said were silent (see the module docstring);
    ``list_term``, the term its list was served under.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        token: str | None,
        *,
        retry_timeout: float = 30.0,
        request_timeout: float = 10.0,
        growing: bool = False,
        alone_request_timeout: float = 10.0,
        tls: StoreTls | None = None,
        connect: Callable[..., HttpStore] = HttpStore,
        prober: Callable[..., Prober] = Prober,
        start: int | None = None,
        term: int = 0,
        absent: Collection[int] = (),
        list_term: int = 0,
    ) -> None:
        self.growing = growing
        self.tls = tls
        """The TLS of every connection to a candidate (None: plain HTTP)."""
        self._prober = prober(endpoints, token or "", growing=growing, tls=tls)
        self._prober.list_term = list_term
        alone = growing and len(endpoints) == 1
        self._client = connect(
            endpoints[start or 0],
            token,
            retry_timeout=retry_timeout if alone else SERVER_RETRY,
            request_timeout=alone_request_timeout if alone else request_timeout,
            tls=tls,
        )
        self._client.refused_is_final = not alone
        self._client.absent = frozenset(absent)
        self._request_timeout = request_timeout
        self._retry_timeout = retry_timeout
        self.term = term
        """The newest term seen: requests carry it, so a replaced server learns it was."""
        self.serving: int | None = start if start is not None else (0 if growing else None)
        """The index of the candidate this client talks to (None: not found yet)."""
        self.on_list: Callable[[tuple[str, ...], int], None] | None = None
        """Told each version of a growing list this client adopts, and its term."""
        self._learning = False
        self._taught: tuple[int | None, str] | None = None
        self._closed = False
        self.failed: dict[str, str] = {}
        """Candidates seen failing, and why (the last time), until seen serving again."""
        self.failovers = 0
        self.own_candidate = ""
        """The endpoint of the candidate on this agent's host, if it stands as one."""
        self.peers: tuple[str, ...] = ()
        """Where the other members of our last round stand by (see the module docstring)."""
        self.leaving = False  # this agent leaves (:meth:`leave`)
        self._moves = 0
        self._lock = asyncio.Lock()
        self._search: asyncio.Task[None] | None = None
        self._started = time.monotonic()
        self._set_headers()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._prober.endpoints

    @property
    def list_term(self) -> int:  # the term our growing list was served under
        return self._prober.list_term

    @property
    def alone(self) -> bool:
        """A growing list that holds the seed only: nothing to fail over to yet."""
        return self.growing and len(self.endpoints) == 1

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows: the candidates, the one serving, failed ones, peers, TLS."""
        serving = None if self.serving is None else self.endpoints[self.serving]
        return {
            "endpoints": list(self.endpoints),
            "growing": self.growing,
            "serving": serving,
            "term": self.term,
            "failovers": self.failovers,
            "failed": dict(self.failed),
            "peers": list(self.peers),
            "tls": self.tls is not None,
            "list_term": self.list_term,
        }

    # -- finding the server ------------------------------------------------------------------

    async def _call(self, request: Callable[[HttpStore], Awaitable[T]]) -> T:
        while True:
            if self._closed:
                raise StoreUnavailable("the store client was closed")
            moves = self._moves
            if self.serving is None:
                await self._find_server(moves, "")
                continue
            try:
                result = await request(self._client)
            except StoreOutcomeUnknown as exc:  # never resent; the next request moves on
                if self.serving is not None:
                    self.failed[self.endpoints[self.serving]] = str(exc)
                raise
            except (StoreUnavailable, StoreNotServing) as exc:
                alone = self.alone and isinstance(exc, StoreUnavailable)
                if alone and not await self._learn_from_peers():
                    raise  # retried for retry_timeout already, and no peer knows another
                await self._find_server(moves, str(exc))
                continue
            self._adopt(self._client.server_term)
            listed = self._client.candidate_list
            if self.growing and listed and listed != list_fingerprint(self.endpoints):
                await self._share_list(listed)
            return result

    async def _share_list(self, listed: str) -> None:
        """The serving candidate's list (fingerprint ``listed``) is not ours: tell it ours,
        take its answer's (once per server and list). A shorter one learns ours (seed 1819
        of ``--failover --kinds ...,restart``: the fence, 20 s); a same-term fork merges it
        (:meth:`~agentd.store.candidates.Prober.merge`: before, two stores served term 2)."""
        told = (self.serving, listed)
        if self._learning or self.serving is None or self._taught == told:
            return
        self._learning = True
        try:
            self._prober.token = self.token or ""
            report = await self._prober.ask(self.serving, "role", self._list(), self.term)
            self._taught = told if report.reachable else self._taught
            self._grow([report])
        finally:
            self._learning = False

    async def _learn_from_peers(self) -> bool:
        """Whether a peer outside our list showed a later version of it (now ours)."""
        outside = [peer for peer in self.peers if peer not in self.endpoints]
        if not (self.growing and outside):
            return False
        self._prober.token = self.token or ""
        reports = await self._prober.peers(outside, self.term)
        reachable = [report for report in reports if report.reachable]
        if not self._grow(reachable):
            return False
        self._adopt(max(report.term for report in reachable))
        said = "Store: %s, which this agent had not heard of, are the candidates now: "
        said += "learned from a peer of its round"
        log.info(said, ",".join(self.endpoints[1:]))
        return True

    def _grow(self, reports: list[RoleReport]) -> bool:
        """Adopt the list that ``reports`` show that replaces ours: served under the
        newest term, the longest of those."""
        newest = sorted(reports, key=lambda r: (r.list_term, len(r.endpoints)), reverse=True)
        return any(self.adopt(report.endpoints, report.list_term) for report in newest)

    def adopt(self, endpoints: Sequence[str], term: int = 0) -> bool:
        """Take ``endpoints``, served under ``term``, as our growing list if it replaces
        ours (:func:`~agentd.store.candidates.replaces`: a later version of it, or a fork
        served under a newer term)."""
        alone, ours = self.alone, self.endpoints
        if not (self.growing and self._prober.take(endpoints, term, "Store")):
            return False
        if alone:  # from now on a lost server is left for another, in time
            timeouts = {"retry_timeout": SERVER_RETRY, "request_timeout": self._request_timeout}
            self._client.set_timeouts(**timeouts)
            self._client.refused_is_final = True
        log.debug("Store: the candidates are now %s", ",".join(endpoints))
        if self.serving is not None:  # a fork's index may be another's in the job's list
            serving = ours[self.serving]
            self.serving = endpoints.index(serving) if serving in endpoints else None
        if self.on_list is not None:
            self.on_list(self._prober.endpoints, self.list_term)
        return True

    async def _find_server(self, moves: int, why: str) -> None:
        """Move to the candidate serving now (promoting one if none does), unless another
        request moved since this one failed (``moves``)."""
        async with self._lock:
            if self._moves != moves:
                return
            old = self.serving
            if old is not None:
                self.failed[self.endpoints[old]] = why
            backoff = Backoff(self._retry_timeout, initial=0.1, maximum=1.0)
            self._prober.token = self.token or ""
            spare = self._client.absent  # silent to the old server's asks: see Prober.roles_of
            reports = await self._prober.roles(self.term, body=self._list(), spare=spare)
            while True:
                reports = await self._with_new_candidates(reports)
                found = await self._serving_or_promoted(reports)
                if found is not None:
                    self._grow([found])  # its list, or ours served under its term
                    self._move(old, found, why)
                    return
                if self.leaving and not any(report.reachable for report in reports):
                    raise StoreLeft(f"no store candidate answers: {self._states(reports)}")
                if not await self._learn_from_peers() and not await backoff.pause():
                    raise StoreUnavailable(self._none_serving(reports))
                reports = await self._prober.roles(self.term, body=self._list(), spare=spare)

    async def _with_new_candidates(self, reports: list[RoleReport]) -> list[RoleReport]:
        """``reports``, or, where they show a longer list, every candidate's again but for
        those that did not answer in time: asked again, one on a lost host would cost its
        probe timeout twice (seed 2929 of ``bench/simulate.py --failover``: 4.1 s). The
        answers are asked again, not kept: one given before this host was cut off would
        pass for a sign that it is not (seed 5548 promoted its own candidate so: S1)."""
        while True:
            self._adopt(max(report.term for report in reports))
            if not self._grow(reports):
                return reports
            silent = {r.index: r for r in reports if not (r.reachable or r.refused)}
            asked = [i for i in range(len(self.endpoints)) if i not in silent]
            answered = await self._prober.roles_of(asked, self.term, self._list())
            reports = sorted([*silent.values(), *answered], key=lambda r: r.index)

    async def _serving_or_promoted(self, reports: list[RoleReport]) -> RoleReport | None:
        serving = [r for r in reports if r.serving and r.term >= self.term]
        if serving:
            return max(serving, key=lambda r: (r.term, -r.index))
        for report in reports:
            if not report.reachable:
                self.failed[report.endpoint] = report.problem
        reachable = [r for r in reports if r.reachable]
        own = self.own_candidate
        if not reachable or not any(
            r.endpoint != own and (r.reachable or r.refused) for r in reports
        ):
            return None  # none but our own host's answers: we may be the one cut off (S1)
        first = reachable[0]
        early = self.serving is None and self.failovers == 0 and not self._moves
        if early and first.index > 0 and time.monotonic() - self._started < STARTUP_GRACE:
            return None  # the lower ones may just not have started yet
        body = {"term": self.term + 1, **self._list()}
        promoted = await self._prober.ask(first.index, "promote", body, self.term)
        self._adopt(promoted.term)
        return promoted if promoted.serving else None

    def _list(self) -> dict[str, Any]:  # a candidate a search steps down learns it too
        return self._prober.list_doc() if self.growing else {}

    def _move(self, old: int | None, found: RoleReport, why: str) -> None:
        self.failed.pop(found.endpoint, None)
        if found.index == old:  # it serves still (a slow answer, not a lost server); had it
            return  # lost its state meanwhile, its new instance would tell the client so
        self.serving = found.index
        self._moves += 1
        self._client.move_to(found.endpoint, lost_state=old is not None)
        if old is None and self.failovers == 0 and self._moves == 1:
            said = "Store: candidate %d of %d, %s, serves (term %d)"
            log.info(said, found.index, len(self.endpoints), found.endpoint, found.term)
            return
        self.failovers += 1
        gone = self.endpoints[old] if old is not None else "the store"
        if not found.inherited:
            said = "Store failover: %s stopped serving (%s); now using %s (candidate %d, term %d); "
            said += "its state starts empty"
            return log.info(said, gone, why or "no answer", found.endpoint, found.index, found.term)
        said = "Store moved: %s handed the store, state and all, to %s (candidate %d, term %d)"
        level = logging.DEBUG if gone == self.own_candidate else logging.INFO  # (it said so)
        log.log(level, said, gone, found.endpoint, found.index, found.term)

    def leave(self) -> None:
        """This agent leaves: from now on a search that finds no candidate answering gives
        up at once (:class:`StoreLeft`) instead of trying for ``retry_timeout``. Its leave
        tells the others it is gone; with every candidate's agent gone (a job stopped
        whole, the store's host handing it over to one leaving too), there are none."""
        self.leaving = True

    def _none_serving(self, reports: list[RoleReport]) -> str:
        states = self._states(reports)
        return f"no store candidate serves, after {self._retry_timeout:g}s of trying ({states})"

    @staticmethod
    def _states(reports: list[RoleReport]) -> str:
        return "; ".join(f"{r.endpoint}: {r.problem or r.role}" for r in reports)

    def _adopt(self, term: int) -> None:
        if term > self.term:
            self.term = term
            self._set_headers()

    def _set_headers(self) -> None:
        headers = self._prober.headers(self.term)
        self._client.extra_headers = {key: headers[key] for key in (TERM_HEADER, CANDIDATES_HEADER)}

    # -- the Store protocol, beyond what ForwardingStore sends -------------------------------

    async def heartbeat(self, key: str, ttl: float) -> bool:
        """:meth:`refresh` in one attempt at the candidate serving now, as
        :meth:`HttpStore.heartbeat`: the membership reads a heartbeat held unanswered as
        one a frozen store received, true of one attempt on one connection, never of
        retries and a search (a member cut off from every candidate extended its lease
        past S6's bound). A failure is raised at once, and the search for the serving
        candidate begins in the background for the requests that follow (a lone seed's
        too, once it says it stands by: a restarted host's own store, stepped down)."""
        if self.serving is None or self._closed:
            return await self.refresh(key, ttl)
        moves = self._moves
        try:
            alive = await self._client.heartbeat(key, ttl)
        except (StoreUnavailable, StoreNotServing) as exc:
            # a lone seed that stands by knows where the job went; an unreachable one, not
            findable = not self.alone or isinstance(exc, StoreNotServing) or bool(self.peers)
            if findable and (self._search is None or self._search.done()):
                self._search = asyncio.create_task(self._search_quietly(moves, str(exc)))
            raise
        self._adopt(self._client.server_term)
        return alive

    async def _search_quietly(self, moves: int, why: str) -> None:
        with contextlib.suppress(StoreUnavailable):  # the requests that follow say it
            await self._find_server(moves, why)

    async def stand(self, endpoint: str) -> dict[str, Any]:
        """Offer ``endpoint`` to the serving candidate of our growing list; its answer's
        list, ours included once admitted, is ours from now on (a member that stood by
        must know where to go should the store's host be lost before its next answer)."""
        answer = await self._call(lambda s: s.stand(endpoint))
        self.adopt(endpoint_list(answer.get("endpoints")), list_term(answer.get("list_term")))
        return answer

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._search)
        await self._client.close()
        await self._prober.close()
