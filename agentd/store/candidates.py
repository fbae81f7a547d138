"""A list of candidate store servers (``--rdzv-endpoint a:p,b:p,c:p``): the protocol they
and their clients share.

Every candidate runs a store server, but one serves at a time; the others stand by. The
one serving does so under a **term**, a number that only grows: each promotion takes a
term higher than any the promoting client has seen. Every request carries the highest
term its client has seen (:data:`TERM_HEADER`), and every answer the server's own, so a
server that was replaced while frozen or cut off learns it from the first request of a
client that moved on, and steps down. Which candidate serves, and when one steps down:

* A client talks to the candidate that answers as serving under the highest term (the
  lowest index among equals). When it finds none serving, it promotes the lowest-index
  candidate that answers, under a new term.
* A server steps down when a request shows it a higher term, or when it finds another
  candidate serving under a higher term (or the same term at a lower index). It looks
  for one only after a sign it may have been replaced (see :mod:`agentd.store.candidacy`),
  so nothing is asked while nothing fails; but in a growing list of three or more, the
  serving candidate asks the others every second, and steps down when none answers (it
  may be the one cut off).

The state a new server starts from is empty: the rendezvous re-creates it (it is soft
state), and the clients see the switch as a store that restarted; unless the serving one
handed it its state as it stepped down (:mod:`agentd.store.succession`).

A list is given (every agent and store is started with the same one), or it **grows**: it
starts with the one endpoint every agent was given (the *seed*) and members append
themselves as they stand by (see :mod:`agentd.store.standby`). A growing list is named by
its seed alone, and only ever appended to, so any two versions agree on every index they
both hold.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentd.exceptions import ConfigError
from agentd.store.tls import tls_problem
from agentd.store.wire import CANDIDATES_HEADER, TERM_HEADER
from agentd.support.aio import cancel_and_wait

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls
    from agentd.support.json_client import JsonClient

PROBE_TIMEOUT = 2.0
"""Seconds a candidate has to answer a probe before it counts as out of reach."""
SPARED = "silent lately: not waited for once the others had answered"
"""Why a candidate the serving one has not heard lately has no answer in a search."""
MAX_CANDIDATES = 8
"""The longest a growing list gets: enough spares for a store, few enough to ask them all
at once when one fails."""


def parse_candidates(text: str, field: str = "--rdzv-endpoint") -> tuple[tuple[str, int], ...]:
    """``host:port[,host:port...]`` into (host, port) pairs; duplicates are an error."""
    from agentd.support.net import split_endpoint

    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise ConfigError(f"{field}: {text!r} has an empty entry (host:port,host:port,...)")
    endpoints = tuple(split_endpoint(part, field) for part in parts)
    seen: set[tuple[str, int]] = set()
    for host, port in endpoints:
        if (host, port) in seen:
            raise ConfigError(f"{field}: {text!r} lists {host}:{port} twice")
        if port == 0 and len(endpoints) > 1:
            raise ConfigError(f"{field}: {text!r}: a candidate needs a fixed port, not 0")
        seen.add((host, port))
    return endpoints


def fingerprint(endpoints: Sequence[str]) -> str:
    """Names one ordered candidate list (the same list in another order is another one)."""
    return hashlib.sha256(",".join(endpoints).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def list_fingerprint(endpoints: tuple[str, ...]) -> str:
    """:func:`fingerprint` of a whole growing list (kept: every answer names it)."""
    return fingerprint(endpoints)


def grows(ours: Sequence[str], theirs: Sequence[str]) -> bool:
    """``theirs`` is a later version of the growing list ``ours``: longer, and the same
    where both have an entry."""
    return len(theirs) > len(ours) and tuple(theirs[: len(ours)]) == tuple(ours)


def replaces(ours: Sequence[str], our_term: int, theirs: Sequence[str], their_term: int) -> bool:
    """``theirs``, a growing list a candidate served under ``their_term``, replaces
    ``ours`` (served under ``our_term``): a later version of it (:func:`grows`), or a fork
    of it served under a newer term. A store host restarted at the endpoint serves a
    fresh list under term 1 and may admit a node to it before the job's serving candidate
    tells it the term; told, it and its clients take the job's list instead of promoting
    their fork over the job's store (``bench/bench_seed_back.py --both-lost``: 22 s). A
    fork served under the same term replaces ours only as a merge of it (longer, holding
    every entry of ours: :meth:`Prober.merge`)."""
    if grows(ours, theirs):
        return True
    forked = bool(theirs) and tuple(ours[: len(theirs)]) != tuple(theirs)
    if forked and their_term == our_term:  # the serving candidate's merge of two forks
        return len(theirs) > len(ours) and set(ours) <= set(theirs)
    return forked and their_term > our_term


def list_term(value: Any) -> int:
    """The term a list in a JSON document was served under (0: not said, or not one)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else 0


def endpoint_list(value: Any) -> tuple[str, ...]:
    """A list of endpoints from a JSON document (anything else: empty)."""
    if not isinstance(value, list) or len(value) > MAX_CANDIDATES:
        return ()
    if not all(isinstance(item, str) and 0 < len(item) <= 300 for item in value):
        return ()
    return tuple(value)


@dataclass(frozen=True)
class RoleReport:
    """What one candidate said when asked its role (``problem``: why it did not answer)."""

    index: int
    endpoint: str
    role: str = ""
    term: int = 0
    problem: str = ""
    endpoints: tuple[str, ...] = ()
    """The candidate's own list, when it grows."""
    list_term: int = 0
    """The term its list was served under (see :func:`replaces`)."""
    refused: bool = False
    """Its host refused the connection: the host is up and reachable, and nothing serves
    there (the candidate's process is gone)."""
    unsure: bool = False
    """No answer came, though the request may have arrived (it may have been carried out)."""
    inherited: bool = False
    """It serves the state its predecessor handed it (:mod:`agentd.store.succession`)."""

    @property
    def serving(self) -> bool:
        return self.role == "serving"

    @property
    def reachable(self) -> bool:
        return not self.problem


class CandidateMismatch(ConfigError):
    """A candidate was started with another candidate list than ours."""


class Prober:
    """Asks candidates their role, or to serve; one connection pool for all of them.

    ``growing``: the list grows from its first endpoint, which alone names it."""

    def __init__(
        self,
        endpoints: Sequence[str],
        token: str,
        timeout: float = PROBE_TIMEOUT,
        *,
        growing: bool = False,
        tls: StoreTls | None = None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.list_term = 0
        """The term our growing list was served under (see :func:`replaces`)."""
        self.token = token
        self._tls = tls
        self.fingerprint = fingerprint(self.endpoints[:1] if growing else self.endpoints)
        self._timeout = timeout
        self._clients: dict[str, JsonClient] = {}
        """One per candidate asked, keeping no connection: a probe is one request."""
        self._closed = False

    @property
    def timeout(self) -> float:
        """Seconds a candidate has to answer one ask."""
        return self._timeout

    def take(self, endpoints: Sequence[str], term: int, who: str, grow_only: bool = False) -> bool:
        """Take ``endpoints``, a growing list served under ``term``, as ours if it replaces
        ours (:func:`replaces`; ``grow_only``: if it is a later version of it); where ours
        is it, or a later version of it, ours was served under ``term`` too. A fork
        replaced is logged, ``who`` naming us."""
        ours = self.endpoints
        if not replaces(ours, self.list_term, endpoints, term):
            if endpoints and tuple(ours[: len(endpoints)]) == tuple(endpoints):  # ours, or later
                self.list_term = max(self.list_term, term)
            return False
        if not grows(ours, endpoints):
            if grow_only:
                return False
            log.info(
                "%s: the candidate list served under term %d, %s, replaces ours (term %d: "
                "%s), which a store restarted at the endpoint served",
                who,
                term,
                ",".join(endpoints),
                self.list_term,
                ",".join(ours),
            )
        self.endpoints, self.list_term = tuple(endpoints), max(self.list_term, term)
        return True

    def merge(self, endpoints: Sequence[str], term: int, who: str) -> list[str]:
        """Serving, told ``endpoints``, a fork of our list served under its term: the
        restarted seed admitted members to a fresh list before a client of the job told
        it the job's. Ours becomes the job's list, then our other entries (its clients keep
        their places; ours take the merge as :func:`replaces` says). The entries added."""
        ours = self.endpoints
        if term != self.list_term or not endpoints or replaces(ours, term, endpoints, term):
            return []
        if tuple(ours[: len(endpoints)]) == tuple(endpoints):
            return []  # ours, or an earlier version of it: not a fork
        merged = (*endpoints, *(e for e in ours if e not in endpoints))[:MAX_CANDIDATES]
        if set(merged) <= set(ours):
            return []
        log.info(
            "%s: a client of the job served under term %d tells the list %s, a fork of ours "
            "(%s): serving %s",
            who,
            term,
            ",".join(endpoints),
            ",".join(ours),
            ",".join(merged),
        )
        self.endpoints = merged
        return [e for e in merged if e not in ours]

    def list_doc(self) -> dict[str, Any]:
        """Our growing list and the term it was served under, as requests and answers
        carry them."""
        return {"endpoints": list(self.endpoints), "list_term": self.list_term}

    def headers(self, term: int) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token}",
            TERM_HEADER: str(term),
            CANDIDATES_HEADER: self.fingerprint,
        }

    async def roles(
        self,
        term: int,
        skip: int | None = None,
        body: dict[str, Any] | None = None,
        spare: Collection[int] = (),
    ) -> list[RoleReport]:
        """Every candidate's role (but ``skip``'s), asked at once, each within the timeout."""
        indexes = [i for i in range(len(self.endpoints)) if i != skip]
        return await self.roles_of(indexes, term, body, spare)

    async def roles_of(
        self,
        indexes: Sequence[int],
        term: int,
        body: dict[str, Any] | None = None,
        spare: Collection[int] = (),
    ) -> list[RoleReport]:
        """The roles of the candidates at ``indexes``, asked at once. Those in ``spare``
        (silent lately) are not waited for once every other one has answered: one on a
        lost host would hold the answers for the whole timeout."""
        asks = {i: asyncio.ensure_future(self.ask(i, "role", body or {}, term)) for i in indexes}
        awaited = [ask for i, ask in asks.items() if i not in spare] or list(asks.values())
        try:
            if awaited:  # none asked: none to wait for
                await asyncio.wait(awaited)
            return [
                ask.result() if ask.done() else RoleReport(i, self.endpoints[i], problem=SPARED)
                for i, ask in asks.items()
            ]
        finally:
            for ask in asks.values():
                if not ask.done():
                    await cancel_and_wait(ask)
                elif not ask.cancelled():
                    ask.exception()  # read: one raised above, once; the others with it

    async def ask(self, index: int, op: str, body: dict[str, Any], term: int) -> RoleReport:
        """``role`` or ``promote`` at candidate ``index``, answered within the timeout; a
        mismatched list raises."""
        return await self.ask_at(index, self.endpoints[index], op, body, term)

    async def peers(self, endpoints: Sequence[str], term: int) -> list[RoleReport]:
        """The roles, and lists, of candidate servers outside our list (index -1), asked
        at once; one started with another list is left out."""

        async def one(endpoint: str) -> RoleReport | None:
            try:
                return await self.ask_at(-1, endpoint, "role", {}, term)
            except CandidateMismatch:
                return None

        reports = await asyncio.gather(*(one(endpoint) for endpoint in endpoints))
        return [report for report in reports if report is not None]

    async def ask_at(
        self, index: int, endpoint: str, op: str, body: dict[str, Any], term: int
    ) -> RoleReport:
        """:meth:`ask` of the candidate server at ``endpoint``, named ``index`` in the
        report."""
        from agentd.support.json_client import MaybeSent, NotSent, TlsFailed

        if self._closed:
            return RoleReport(index, endpoint, problem="this client was closed")
        headers = {"Content-Type": "application/json", **self.headers(term)}
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._client(endpoint).post(
                    f"/v1/{op}", json.dumps(body).encode(), headers, None, self._timeout
                )
            doc = json.loads(reply.body)
        except TimeoutError:
            why = "no answer within the probe timeout"
            return RoleReport(index, endpoint, problem=why, unsure=True)
        except TlsFailed as exc:
            return RoleReport(index, endpoint, problem=tls_problem(exc.__cause__ or exc))
        except NotSent as exc:
            cause = exc.__cause__
            why = getattr(cause, "strerror", None) or str(cause or exc)
            return RoleReport(
                index, endpoint, problem=f"cannot connect ({why})", refused=exc.refused
            )
        except MaybeSent as exc:
            why = str(exc) or "the connection was lost"
            return RoleReport(index, endpoint, problem=why, unsure=True)
        except ValueError:
            return RoleReport(index, endpoint, problem=f"{reply.status}: the answer is not JSON")
        return self.report(index, reply.status, doc, endpoint)

    def _client(self, endpoint: str) -> JsonClient:
        from agentd.store.sockets import keepalive_socket
        from agentd.support.json_client import JsonClient
        from agentd.support.net import split_endpoint

        client = self._clients.get(endpoint)
        if client is None:
            context = None if self._tls is None else self._tls.client
            host, port = split_endpoint(endpoint)
            client = JsonClient(host, port, context, 0.0, keepalive_socket)
            self._clients[endpoint] = client
        return client

    def report(self, index: int, status: int, doc: Any, endpoint: str) -> RoleReport:
        """The answer (``status``, JSON ``doc``) of the candidate at ``endpoint``, index
        ``index`` of our list (-1: none of it), as a report; a mismatched list raises."""
        error = doc.get("error", "") if isinstance(doc, dict) else ""
        if status == 409 and isinstance(doc, dict) and doc.get("mismatch"):
            raise CandidateMismatch(f"--rdzv-endpoint: {error}")
        if status != 200 or not isinstance(doc, dict):
            return RoleReport(index, endpoint, problem=f"{status} {error}".strip())
        return RoleReport(
            index,
            endpoint,
            str(doc.get("role", "")),
            int(doc.get("term", 0)),
            endpoints=endpoint_list(doc.get("endpoints")),
            list_term=list_term(doc.get("list_term")),
            inherited=doc.get("inherited") is True,
        )

    async def close(self) -> None:
        self._closed = True
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def none_serving(status: dict[str, Any] | None) -> str:
    """From a candidate client's status: every candidate and why it does not serve, while
    none does ('' when one serves, or without candidates). The one it used stays named as
    serving while it searches, but it is among the failed then."""
    if not status or "failed" not in status:  # no candidates: a store at one place
        return ""
    failed = status["failed"]
    if status.get("serving") is not None and status["serving"] not in failed:
        return ""
    states = "; ".join(f"{e}: {failed.get(e, 'no answer yet')}" for e in status["endpoints"])
    return f"no store candidate serves ({states})"
