"""The embedded store server: a :class:`MemoryStore` over HTTP, for rendezvous.

``POST /v1/<op>`` with a JSON body; values travel as base64, over the lean HTTP/1.1 of
:mod:`agentd.support.json_http` (a rendezvous's requests come all at once). Bearer-token
auth (required when binding anything but loopback); bounded key, value and body sizes;
every bad request gets a 4xx with ``{"error": "..."}`` and changes nothing. Long polls
(``wait``, ``watch``) are capped at :data:`~agentd.store.wire.MAX_POLL` seconds. The
operations and their checks are in :mod:`agentd.store.ops`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hmac
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.exceptions import ConfigError, StartError
from agentd.store import token_file
from agentd.store.api import StoreError, StoreFull, StoreNotServing, StoreTimeout, WatchResult
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import endpoint_list, list_fingerprint, list_term
from agentd.store.memory import MemoryStore
from agentd.store.ops import OPS, Args, BadRequest, decode_items, term_header, watch_doc
from agentd.store.tls import scheme
from agentd.store.wire import (
    ABSENT_HEADER,
    CANDIDATE_COUNT_HEADER,
    CANDIDATE_LIST_HEADER,
    CANDIDATES_HEADER,
    INHERIT_MAX_BODY,
    INSTANCE_HEADER,
    MAX_CONNECTIONS,
    NOT_SERVING,
    TERM_HEADER,
)
from agentd.support.collector import collector_paused
from agentd.support.http_messages import Request, error_body
from agentd.support.http_site import Limits, ServerLog
from agentd.support.json_http import Answer, JsonHttpServer
from agentd.support.net import is_loopback, split_endpoint
from agentd.support.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20
GC_YOUNG = 10_000
"""Allocations between two young collections while a store serves (Python's default is
700): every request allocates a few hundred objects, and a 4,096-node rendezvous spent a
fifth of the store's CPU collecting them (860 -> 660 us per join)."""
LIMITS = Limits(max_connections=MAX_CONNECTIONS, idle_timeout=30.0, body_timeout=10.0)
"""The idle timeout is well past the time clients keep an idle connection
(http_client.KEEPALIVE, 8 s), so a connection is never reused just as the server closes
it, even by a client whose loop lags seconds behind its answers (16,384 handlers, 4,096
per process: with 10 s, thousands of ``add`` requests went out on connections the store
had just closed, their outcome unknown)."""
CANDIDATE_OPS = frozenset({"role", "promote", "stand", "inherit"})
CANDIDATES_KEY = CANDIDATES_HEADER.lower()
TERM_KEY = TERM_HEADER.lower()
LONG_POLLS = frozenset({"wait", "watch"})
"""The operations that wait: a candidate stepping down answers them at once."""


class StoreServer:
    """Serves a :class:`MemoryStore` on ``host:port`` (port 0: an ephemeral one).

    Every request needs the bearer ``token``. Without one (only on loopback), the server
    takes the one a job's member keeps for ``port``, else makes its own, and publishes it
    for this user's clients on this host, from the moment it listens until it stops (see
    :mod:`agentd.store.token_file`).

    With a ``candidacy``, it is one of several candidates: it serves only while promoted,
    each time from an empty store, and answers 421 meanwhile (see
    :mod:`agentd.store.candidacy`).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        store: MemoryStore | None = None,
        max_connections: int = MAX_CONNECTIONS,
        limits: Limits = LIMITS,
        candidacy: Candidacy | None = None,
        tls: StoreTls | None = None,
    ) -> None:
        if not token and not is_loopback(host):
            raise ConfigError(
                f"--store-token: required when the store binds {host!r}, which is not loopback "
                "(or AGENTD_STORE_TOKEN)"
            )
        self.host = host
        self.port = port
        self.tls = tls
        """Served over TLS with this node's certificate (None: plain HTTP)."""
        self._given_token = bool(token)
        self.token = token or (port and token_file.read(port)) or token_file.new_token()
        self._token = self.token.encode()
        self.token_file: Path | None = None
        """Where the token this server made is published (None: the user gave one)."""
        self.store = store or MemoryStore()
        self.instance = os.urandom(8).hex()
        """Names this server's state: clients see a restart (state lost) when it changes."""
        self.inherited = False
        """Our state is the one our predecessor handed us (:mod:`agentd.store.succession`)."""
        self._unheld = asyncio.Event()
        self._unheld.set()
        self.candidacy = candidacy
        if candidacy is not None:
            candidacy.on_promote = self._fresh_store
            candidacy.on_step_down = self._drop_store
            candidacy.share_token(self.token)
        self._http: JsonHttpServer | None = None
        self._problems = RateLimitedLog(log)
        self._limits = dataclasses.replace(limits, max_connections=max_connections)
        self.server_log = ServerLog("store", self._limits.log_interval)
        """Where aiohttp reports, and malformed requests are counted."""

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, what: str | None = None, host_what: str | None = None) -> None:
        """Listen (a StartError naming ``what``, the port's option, else the store, or
        ``host_what``, the address's, where this host has no such address)."""
        young, middle, old = gc.get_threshold()
        gc.set_threshold(max(young, GC_YOUNG), middle, old)
        context = None
        if self.tls is not None:
            context = self.tls.server_context(self._refused_handshake)
        http = JsonHttpServer(
            self._handle, "store", self._limits, self.server_log, MAX_BODY, self._body_limit
        )
        self.port = await http.start(self.host, self.port, context, what, host_what)
        self._http = http
        if not self._given_token:
            try:
                self.token_file = token_file.publish(self.port, self.token)
            except (OSError, StartError) as exc:
                await self.stop()
                raise StartError(f"store token: cannot publish it: {exc}") from None
        log.info(
            "Store listening on %s://%s%s",
            scheme(self.tls),
            self.endpoint,
            f" (its token in {self.token_file}, for this user only)" if self.token_file else "",
        )

    def _refused_handshake(self, why: str) -> None:
        """A client's TLS handshake failed: one WARNING line per interval, with the count."""
        self._problems.warning(
            "tls",
            "Store %s: refused a TLS handshake (%s); a client "
            "without a certificate of the CA, or of another job?",
            self.endpoint,
            why,
        )

    def _fresh_store(self) -> None:
        candidacy = self.candidacy
        assert candidacy is not None
        self.store = MemoryStore(on_lapse=candidacy.suspect)
        self.instance = os.urandom(8).hex()
        self.inherited = False

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While this holds, every request that could change our state (or the list we
        serve) waits: the state is being handed to a successor."""
        self._unheld.clear()
        try:
            yield
        finally:
            self._unheld.set()

    async def _drop_store(self) -> None:
        await self.store.close()

    async def stop(self) -> None:
        if self.candidacy is not None:
            await self.candidacy.close()
        if self.token_file is not None:
            token_file.withdraw(self.port, self.token)
            self.token_file = None
        if self._http is not None:
            await self._http.stop()
            self._http = None
        await self.store.close()

    # -- request handling --------------------------------------------------------------------

    async def _handle(self, request: Request) -> Answer:
        """Auth first, then ``POST /v1/<op>``; a failure of ours is a 500 and one log
        line per interval, never a traceback to the client."""
        if not self._authorized(request.headers.get("authorization", "")):
            return _error(401, "authorization: a valid bearer token is required")
        prefix, _, op = request.path.partition("/v1/")
        if prefix or not op or "/" in op:
            return _error(404, f"path: {request.path[:80]!r} is not /v1/<op>")
        if request.method != "POST":
            return _error(405, f"method: {request.method[:20]!r} is not POST", {"Allow": "POST"})
        try:
            status, doc, headers = await self.answer(op, request.body, request.headers)
        except Exception as exc:  # a bug, not the client's fault: one line, no traceback
            self._problems.error("internal", "Store: %s failed: %r", request.path, exc)
            return _error(500, f"internal error: {type(exc).__name__}")
        return status, json.dumps(doc).encode(), headers

    def _body_limit(self, path: str, headers: Mapping[str, str]) -> int:
        inherit = path == "/v1/inherit" and self._authorized(headers.get("authorization", ""))
        return INHERIT_MAX_BODY if inherit else MAX_BODY

    def _authorized(self, header: str) -> bool:
        """The request carries our bearer token (compared in constant time, as bytes)."""
        scheme, _, token = header.partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(token.encode(), self._token)

    async def answer(
        self, op: str, raw: bytes, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The answer to an authorized ``POST /v1/<op>`` with body ``raw`` and the request's
        ``headers`` (names in lower case), apart from HTTP: its status, JSON document and
        headers. Every broken rule is a 4xx naming it. (The protocol simulation serves
        through this alone.)"""
        candidacy = self.candidacy
        try:
            if candidacy is None:
                return await self._serve(op, raw)
            mismatch = candidacy.mismatch(headers.get(CANDIDATES_KEY))
            if mismatch:
                return 409, {"error": mismatch, "mismatch": True}, {}
            candidacy.observe(term_header(headers.get(TERM_KEY, "0")))
            status, doc, answered = await self._serve(op, raw)
            answered[TERM_HEADER] = str(candidacy.term)
            if candidacy.growing:
                answered[CANDIDATE_COUNT_HEADER] = str(len(candidacy.endpoints))
                answered[CANDIDATE_LIST_HEADER] = list_fingerprint(candidacy.endpoints)
            absent = candidacy.absent()
            if absent:
                answered[ABSENT_HEADER] = ",".join(map(str, absent))
            return status, doc, answered
        except StoreNotServing as exc:
            return NOT_SERVING, {"error": str(exc)}, {}
        except BadRequest as exc:
            return 400, {"error": str(exc)}, {}
        except StoreTimeout as exc:
            return 408, {"error": str(exc)}, {}
        except StoreFull as exc:
            self._problems.warning("full", "Store: %s", exc)
            return 507, {"error": str(exc)}, {}
        except StoreError as exc:
            return 409, {"error": str(exc)}, {}

    async def _serve(self, op: str, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        method = OPS.get(op)
        candidacy = self.candidacy
        if op in CANDIDATE_OPS:
            if op == "stand":  # a list changed under a hand-over would be lost with it
                await self._unheld.wait()
            with collector_paused() if op == "inherit" else contextlib.nullcontext():
                return 200, self._candidate_op(op, raw), {}
        if method is None:
            return 404, {"error": f"op: {op!r} is not one of {sorted(OPS)}"}, {}
        try:
            body = json.loads(raw) if raw else {}
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("body: not valid JSON") from None
        except RecursionError:
            raise BadRequest("body: JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("body: must be a JSON object")
        if candidacy is not None:  # a candidate cut off from the others renews no lease
            await candidacy.confirm_contact()
        await self._unheld.wait()  # (no wait when nothing holds)
        if candidacy is not None and not candidacy.serving:  # checked after the last await:
            raise StoreNotServing(candidacy.not_serving_message())  # no step-down comes first
        seen = body.get("instance")
        if op == "watch" and seen is not None and seen != self.instance:
            # the client's revisions are another store's (we restarted): a long poll on them
            # could wait for changes that will never come, so say so at once
            lost = WatchResult(await self.store.revision(), compacted=True)
            return 200, watch_doc(lost), {INSTANCE_HEADER: self.instance}
        instance = self.instance
        if candidacy is not None and op in LONG_POLLS:  # the others never wait on the loop
            result = await candidacy.while_serving(method(self.store, Args(body)))
        else:
            result = await method(self.store, Args(body))
        return 200, result, {INSTANCE_HEADER: instance}

    def _candidate_op(self, op: str, raw: bytes) -> dict[str, Any]:
        """``role`` (any server: one without a candidacy always serves), ``promote``,
        ``inherit`` (a promotion with the state of the serving candidate, which hands it
        down: :mod:`agentd.store.succession`; written before anyone is answered from the
        new store) and ``stand`` (a member joining a growing list; only the serving
        candidate admits)."""
        candidacy = self.candidacy
        if candidacy is None:
            if op != "role":
                raise BadRequest(f"op: {op!r} needs a store started as a candidate")
            return {"role": "serving", "term": 0}
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("body: not valid JSON") from None
        body = body if isinstance(body, dict) else {}
        endpoints = endpoint_list(body.get("endpoints"))
        served = list_term(body.get("list_term"))
        if op == "promote":
            candidacy.promote(Args(body).integer("term"), endpoints, served)
        elif op == "inherit":
            items, term = decode_items(body.get("items")), Args(body).integer("term")
            newer = candidacy.term < term
            if newer:
                candidacy.promote(term, endpoints, served)
            took = newer and candidacy.serving and candidacy.term == term
            if took:  # promoted now, with a fresh store: nobody has been answered from it
                self.store.restore(items)
                self.inherited = True
            return {**candidacy.document(), "inherited": took}
        elif op == "stand":
            if not candidacy.growing:
                raise BadRequest("op: 'stand' needs a growing candidate list (one endpoint)")
            if not candidacy.serving:
                raise StoreNotServing(candidacy.not_serving_message())
            admitted = candidacy.admit(_endpoint(body.get("endpoint")))
            return {**candidacy.document(), "admitted": admitted}  # the list, with it
        else:
            candidacy.extend(endpoints, served)
        return {**candidacy.document(), "inherited": candidacy.serving and self.inherited}


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Answer:
    return status, error_body(message), headers or {}


def _endpoint(value: Any) -> str:
    """A member's ``host:port`` from a ``stand`` request, or a BadRequest naming it."""
    text = value if isinstance(value, str) and len(value) <= 300 else ""
    try:
        _, port = split_endpoint(text, "endpoint")
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None
    if port == 0 or text != text.strip():
        raise BadRequest(f"endpoint: {text!r} must be host:port with a fixed port")
    return text
