"""HttpStore: the Store protocol over the embedded server's HTTP API (the lean client of
:mod:`agentd.support.json_client`).

Connection failures are retried with jittered exponential backoff until ``retry_timeout``
runs out, so a store that restarts, or starts a little after its clients, is waited for.
A request that may have reached the server is resent only if resending cannot change
the outcome (everything but ``add``; ``add_once`` is).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agentd.store import token_file
from agentd.store.api import (
    KeyEvent,
    StoreAuthError,
    StoreError,
    StoreOutcomeUnknown,
    StoreTimeout,
    StoreUnavailable,
    WatchResult,
)
from agentd.store.retry import Backoff
from agentd.store.sockets import keepalive_socket
from agentd.store.tls import scheme, tls_problem
from agentd.store.wire import (
    ABSENT_HEADER,
    CANDIDATE_COUNT_HEADER,
    CANDIDATE_LIST_HEADER,
    INSTANCE_HEADER,
    MAX_KEYS,
    MAX_POLL,
    TERM_HEADER,
    b64,
    index_list,
    refusal,
    unb64,
)
from agentd.support.json_client import JsonClient, MaybeSent, NotSent, TlsFailed
from agentd.support.net import is_loopback

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls

log = logging.getLogger(__name__)

KEEPALIVE = 8.0
"""Seconds an idle pooled connection is kept: longer than the heartbeat interval (5 s by
default), so each heartbeat reuses the last one's connection rather than opening one, and
less than the server's idle timeout, so a connection is never reused just as the server
closes it."""


_JSON = {"Content-Type": "application/json"}
INSTANCE_KEY, TERM_KEY, COUNT_KEY, ABSENT_KEY = (
    name.lower() for name in (INSTANCE_HEADER, TERM_HEADER, CANDIDATE_COUNT_HEADER, ABSENT_HEADER)
)
LIST_KEY = CANDIDATE_LIST_HEADER.lower()


class HttpStore:
    """A client of :class:`~agentd.store.server.StoreServer` at ``host:port``.

    Without a ``token``, a client of a loopback store uses the one its server published
    for this user (:mod:`agentd.store.token_file`), waiting for it to appear and reading it
    again when refused, as a store that restarts makes a new one.
    """

    def __init__(
        self,
        endpoint: str,
        token: str | None = None,
        *,
        retry_timeout: float = 30.0,
        request_timeout: float = 10.0,
        backoff_initial: float = 0.02,
        backoff_max: float = 1.0,
        tls: StoreTls | None = None,
    ) -> None:
        self._tls = tls
        base = endpoint if "://" in endpoint else f"{scheme(tls)}://{endpoint}"
        self.url = base.rstrip("/")
        self._token = token
        self._token_port: int | None = None
        """The loopback store whose published token we use (None: ``token`` was given)."""
        if not token:
            parts = urlsplit(self.url)
            if parts.hostname and is_loopback(parts.hostname) and parts.port:
                self._token_port = parts.port
        self._retry_timeout = retry_timeout
        self._request_timeout = request_timeout
        self._backoff = (backoff_initial, backoff_max)
        self._connections: JsonClient | None = None
        self._connected_url = ""
        self.requests = 0
        """Requests sent, retries included (for benchmarks and metrics)."""
        self.observer: Callable[[str, float], None] | None = None
        """Told (operation, seconds) after each answered request but long polls (metrics)."""
        self.instance: str | None = None
        """The server instance we last heard from (its ``Agentd-Store-Instance`` header)."""
        self._base = 0
        """Added to the server's revisions: each server (or instance) we move to gets a base
        past every revision handed out before, so revisions only grow across moves."""
        self._moved_at = 0
        """Revisions below this are another server's: a watch after one answers
        ``compacted``, whoever asks (several watches may run at once)."""
        self._highest = 0
        """The highest revision handed out."""
        self.incarnation = 0
        """How many times the store behind this client was replaced (a restart, a move):
        what a request wrote before a change may be missing after it."""
        self.extra_headers: dict[str, str] = {}
        """Sent with every request (a candidate list's term and fingerprint)."""
        self.server_term = 0
        """The term the server last answered under (candidate servers only)."""
        self.candidate_count, self.candidate_list = 0, ""
        """How many candidates the server's growing list holds (0: it has none), and that
        list's fingerprint (see :data:`CANDIDATE_LIST_HEADER`)."""
        self.absent: frozenset[int] = frozenset()
        """The candidates the server said it has not heard lately (see :data:`ABSENT_HEADER`)."""
        self._closed = False
        self.refused_is_final = False
        """A refused connection fails the request at once, unretried: nothing listens
        there, and there are other candidates to ask (see :mod:`agentd.store.failover`)."""

    @property
    def token(self) -> str | None:
        """The token requests carry (on loopback without one: the published one)."""
        return self._headers().get("Authorization", "").partition(" ")[2] or None

    def set_timeouts(self, *, retry_timeout: float, request_timeout: float) -> None:
        self._retry_timeout, self._request_timeout = retry_timeout, request_timeout

    def move_to(self, endpoint: str, *, lost_state: bool) -> None:
        """Talk to the server at ``endpoint`` from now on. ``lost_state``: it is not the
        store we talked to before, so a watch after an earlier revision answers
        ``compacted``."""
        self.url = f"{scheme(self._tls)}://{endpoint}"
        self.instance = None
        if lost_state:
            self._rebase()
        self.server_term, self.candidate_count, self.candidate_list = 0, 0, ""
        self.absent = frozenset()

    async def _call(
        self,
        op: str,
        body: dict[str, Any],
        poll: float = 0.0,
        idempotent: bool = True,
        once: bool = False,
    ) -> dict[str, Any]:
        """POST ``body`` to ``op``, retrying what can be retried for ``retry_timeout``.

        ``once``: a single attempt with no time limit but TCP's own (see
        :mod:`agentd.store.sockets`): answered, or failed because the store is out of
        reach, never given up on while it merely waits at a frozen store."""
        if self._closed:
            raise StoreUnavailable(f"store at {self.url}: {op} after the client was closed")
        client = self._client()
        path = f"/v1/{op}"
        data = json.dumps(body).encode()
        backoff = Backoff(0.0 if once else self._retry_timeout, *self._backoff)
        timeout = None if once else self._request_timeout + poll
        while True:
            if self._closed:  # closed, before or while it waited to retry (a failover)
                raise StoreUnavailable(f"store at {self.url}: {op} after the client was closed")
            self.requests += 1
            began = time.monotonic()
            headers = self._headers()
            try:
                reply = await client.post(path, data, headers, timeout, self._request_timeout)
                answer = json.loads(reply.body)
            except TlsFailed as exc:  # retrying would fail the same way
                raise StoreAuthError(
                    f"store at {self.url}: {tls_problem(exc.__cause__ or exc)}"
                ) from None
            except NotSent as exc:
                if self.refused_is_final and exc.refused:
                    raise StoreUnavailable(f"store at {self.url}: connection refused") from exc
                problem: BaseException = exc
            except MaybeSent as exc:
                if not idempotent:
                    raise StoreOutcomeUnknown(
                        f"store at {self.url}: {op} failed ({exc}); "
                        "not resent, it may have been applied"
                    ) from exc
                problem = exc
            except ValueError as exc:
                raise StoreError(f"store at {self.url}: {op}: the answer is not JSON") from exc
            else:
                status = reply.status
                self._note_answer(reply.headers)
                if status == 503:  # overloaded (too many connections): nothing was done
                    problem = StoreError(
                        f"{op}: 503 {answer.get('error', '') if isinstance(answer, dict) else ''}"
                    )
                elif status == 401 and self._token_port is not None:
                    # the published token: not there yet, or an earlier store's; read again
                    self._token = None
                    given = "Authorization" in headers
                    problem = token_file.refused(self.url, self._token_port, given)
                else:
                    if self.observer is not None and not poll:  # a long poll is not latency
                        self.observer(op, time.monotonic() - began)
                    return self._answer(op, status, answer)
            log.debug("Store %s: %s failed (%s); retrying", self.url, op, problem)
            if not await backoff.pause():
                if isinstance(problem, StoreAuthError):
                    raise problem
                after = "" if once else f" after {self._retry_timeout:g}s"
                hint = ""
                if self._tls is not None and isinstance(problem, MaybeSent):
                    hint = " (over TLS: it may refuse this node's certificate; see its log)"
                raise StoreUnavailable(
                    f"store at {self.url} is unreachable{after}: {problem}{hint}"
                ) from problem

    def _headers(self) -> dict[str, str]:
        token = self._token
        if self._token_port is not None and token is None:  # read once; again when refused
            token = self._token = token_file.read(self._token_port)
        headers = dict(_JSON)
        headers.update(self.extra_headers)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _client(self) -> JsonClient:
        """The connections to the server at :attr:`url` (new ones after a move)."""
        client = self._connections
        if client is not None and self._connected_url == self.url:
            return client
        self._connected_url = self.url
        parts = urlsplit(self.url)
        where = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        client = self._connections
        if client is None or (client.host, client.port) != where:
            if client is not None:
                client.close()
            context = None if self._tls is None else self._tls.client
            client = JsonClient(*where, context, KEEPALIVE, keepalive_socket)
            self._connections = client
        return client

    def _note_answer(self, headers: Mapping[str, str]) -> None:
        self._note_instance(headers.get(INSTANCE_KEY))
        term = headers.get(TERM_KEY, "")
        if term.isdigit():
            self.server_term = int(term)
            self.absent = index_list(headers.get(ABSENT_KEY, ""))
        count = headers.get(COUNT_KEY, "")
        if count.isdigit():
            self.candidate_count = int(count)
            self.candidate_list = headers.get(LIST_KEY, "")[:64]

    def _note_instance(self, instance: str | None) -> None:
        if instance is None:
            return
        if self.instance is not None and instance != self.instance:
            log.info("Store %s restarted: its state starts empty, so the round re-forms", self.url)
            self._rebase()
        self.instance = instance

    def _rebase(self) -> None:
        self._base = self._moved_at = self._highest + 1
        self.incarnation += 1

    def _revision(self, server_revision: Any) -> int:
        """A server revision as this client hands it out."""
        revision = int(server_revision) + self._base
        self._highest = max(self._highest, revision)
        return revision

    def _answer(self, op: str, status: int, data: Any) -> dict[str, Any]:
        if status == 200 and isinstance(data, dict):
            return data
        message = data.get("error", "") if isinstance(data, dict) else ""
        raise refusal(status, f"store at {self.url}", op, message)

    # -- the Store protocol ------------------------------------------------------------------

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> int:
        doc = await self._call("set", {"key": key, "value": b64(value), "ttl": ttl})
        return self._revision(doc["revision"])

    async def get(self, key: str) -> bytes | None:
        return unb64((await self._call("get", {"key": key}))["value"])

    async def add(self, key: str, delta: int) -> int:
        doc = await self._call("add", {"key": key, "delta": delta}, idempotent=False)
        return int(doc["value"])

    async def add_once(
        self, counter: str, marker: str, mark: bytes, absent: Sequence[str] = ()
    ) -> tuple[bool, int]:
        body = {"counter": counter, "marker": marker, "mark": b64(mark), "absent": list(absent)}
        doc = await self._call("add_once", body)  # resent: the marker counts it once
        return bool(doc["counted"]), int(doc["value"])

    async def compare_set(
        self,
        key: str,
        expected: bytes | None,
        desired: bytes,
        ttl: float | None = None,
        present: Sequence[str] = (),
        absent: Sequence[str] = (),
    ) -> tuple[bool, bytes | None]:
        body: dict[str, Any] = {"key": key, "desired": b64(desired), "ttl": ttl}
        body.update(expected=b64(expected), present=list(present), absent=list(absent))
        doc = await self._call("compare_set", body)
        return bool(doc["succeeded"]), unb64(doc["value"])

    async def refresh(self, key: str, ttl: float) -> bool:
        return bool((await self._call("refresh", {"key": key, "ttl": ttl}))["refreshed"])

    async def heartbeat(self, key: str, ttl: float) -> bool:
        """:meth:`refresh`, in one attempt that waits as long as the connection lives (the
        rendezvous learns from a heartbeat held by a frozen store; see membership.py)."""
        doc = await self._call("refresh", {"key": key, "ttl": ttl}, once=True)
        return bool(doc["refreshed"])

    async def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """One request per :data:`MAX_KEYS` keys (a 4,096-node round's entries and more)."""
        values: list[bytes | None] = []
        for start in range(0, len(keys), MAX_KEYS):
            chunk = list(keys[start : start + MAX_KEYS])
            values += map(unb64, (await self._call("multi_get", {"keys": chunk}))["values"])
        return values

    async def multi_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> int:
        body = {"items": {k: b64(v) for k, v in items.items()}, "ttl": ttl}
        return self._revision((await self._call("multi_set", body))["revision"])

    async def delete(self, key: str) -> bool:
        return bool((await self._call("delete", {"key": key}))["deleted"])

    async def delete_prefix(self, prefix: str) -> int:
        return int((await self._call("delete_prefix", {"prefix": prefix}))["deleted"])

    async def num_keys(self) -> int:
        return int((await self._call("num_keys", {}))["count"])

    async def revision(self) -> int:
        return self._revision((await self._call("revision", {}))["revision"])

    async def wait(self, keys: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            poll = max(0.0, min(MAX_POLL, deadline - time.monotonic()))
            try:
                await self._call("wait", {"keys": list(keys), "timeout": poll}, poll=poll)
                return
            except StoreTimeout:
                if time.monotonic() >= deadline:
                    raise

    async def watch(self, prefix: str, after_revision: int, timeout: float) -> WatchResult:
        """As the protocol says; a revision from before the server restarted (or before
        we moved to another server) answers ``compacted``: it was the old store's, which
        the new one may even have overtaken. This holds for every watch, however many run
        at once. The watch also names the server instance it belongs to, so a restarted
        server answers it at once, even one retried after the restart."""
        if after_revision < self._moved_at:
            return WatchResult(await self.revision(), compacted=True)
        poll = max(0.0, min(MAX_POLL, timeout))
        base = self._base
        body = {
            "prefix": prefix,
            "after_revision": after_revision - base,
            "timeout": poll,
            "instance": self.instance,
        }  # a different server answers at once
        doc = await self._call("watch", body, poll=poll)
        if self._base != base:  # the server restarted, or we moved, during this watch
            return WatchResult(await self.revision(), compacted=True)
        events = tuple(
            KeyEvent(e["key"], unb64(e["value"]), self._revision(e["revision"]))
            for e in doc["events"]
        )
        return WatchResult(self._revision(doc["revision"]), events, bool(doc["compacted"]))

    async def stand(self, endpoint: str) -> dict[str, Any]:
        """Offer ``endpoint`` as a candidate to a growing list's serving candidate: its
        role document, with ``admitted`` (see :mod:`agentd.store.standby`)."""
        return await self._call("stand", {"endpoint": endpoint})

    async def close(self) -> None:
        """Close the connections; a request after this fails (none opens them again)."""
        self._closed = True
        if self._connections is not None:
            self._connections.close()
            self._connections = None
