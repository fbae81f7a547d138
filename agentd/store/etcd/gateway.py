"""The etcd v3 JSON gateway as one client talks to it: members, failover, retries, auth.

Every request is a POST of JSON to the member in use. A connection failure or a transient
refusal (:mod:`agentd.store.etcd.codes`) moves to the next member and retries with backoff
until ``retry_timeout``; a write that may have been applied is resent only when it is
idempotent. A refusal of the request itself, TLS trouble and refused credentials raise at
once (exit 3). With a username, the password is traded for a token, again when it expires.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from agentd.store.aiohttp_failures import MAYBE_SENT, NOT_SENT
from agentd.store.api import (
    StoreAuthError,
    StoreError,
    StoreOutcomeUnknown,
    StoreRefused,
    StoreUnavailable,
)
from agentd.store.etcd.codes import NOT_FOUND, UNAUTHENTICATED, Verdict, classify
from agentd.store.retry import Backoff
from agentd.store.sockets import keepalive_socket

log = logging.getLogger(__name__)


SILENT_FOR = 30.0
"""Seconds a member that gave no answer is passed over while another may answer."""


class LeaseLapsed(StoreRefused):
    """A write named a lease etcd no longer has: it lapsed (or was revoked) after its grant.
    The write was refused whole; under a new lease it can be sent again."""


_TLS_FAILED = (aiohttp.ClientSSLError,)


class EtcdGateway:
    """Requests to the etcd cluster at ``endpoints`` (base URLs, ``http://host:port`` or
    ``https://...``), failing over between them."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ssl_context: ssl.SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        retry_timeout: float = 30.0,
        request_timeout: float = 10.0,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._ssl = ssl_context
        self._credentials = (username, password or "") if username else None
        self._token: str | None = None
        self.retry_timeout = retry_timeout
        self.request_timeout = request_timeout
        self._current = 0
        self._silent_at: dict[str, float] = {}
        """When each member last gave no answer (monotonic seconds; see :meth:`fail_over`)."""
        self._left: dict[str, asyncio.Event] = {}
        """Per member, the event :meth:`left` gives (set as the client moves on from it)."""
        self.answering = True
        """The member in use answered last time (so a failure is news worth a warning)."""
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.requests = 0
        """Requests sent, retries included (for benchmarks and metrics)."""
        self.observer: Callable[[str, float], None] | None = None
        """Told (operation, seconds) after each answered request but watches (metrics)."""

    @property
    def where(self) -> str:
        """The endpoints, for messages."""
        return ",".join(self.endpoints)

    @property
    def endpoint(self) -> str:
        """The member in use."""
        return self.endpoints[self._current]

    @property
    def has_credentials(self) -> bool:
        return self._credentials is not None

    async def ensure_token(self) -> None:
        """Authenticate first if a username is set and no token is held."""
        if self._credentials and self._token is None:
            await self.authenticate()

    def forget_token(self) -> None:
        """The token expired (a watch was cancelled for it): get a new one next time."""
        self._token = None

    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (made at first use); StoreUnavailable once :meth:`close` ran."""
        if self._closed:
            raise StoreUnavailable(f"etcd at {self.where}: the client was closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else True, socket_factory=keepalive_socket
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    def fail_over(self, failed: str, problem: str, silent: bool) -> None:
        """Move on from the member ``failed`` to the next; say so once when the one in use
        stops answering. ``silent``: it gave no answer (no connection, or none in time).
        Such a member is passed over for :data:`SILENT_FOR` while another may answer:
        etcd's answers that its cluster is electing a leader move the client on too, and
        took it round to a stalled member again, whose first answers once it resumed were
        stale. Where another request moved on already (several were waiting on a stalled
        member, and each fails), nothing changes."""
        now = time.monotonic()
        if silent:
            self._silent_at[failed] = now
        if self.endpoints[self._current] != failed:
            return
        if (leaving := self._left.pop(failed, None)) is not None:
            leaving.set()  # the watches waiting there start again where the client goes
        count = len(self.endpoints)
        others = [(self._current + step) % count for step in range(1, count)] or [0]
        quiet = {member for member, at in self._silent_at.items() if now - at < SILENT_FOR}
        self._current = next((i for i in others if self.endpoints[i] not in quiet), others[0])
        if self.answering and len(self.endpoints) > 1:
            log.warning(
                "etcd member %s failed (%s); trying %s",
                failed,
                problem,
                self.endpoints[self._current],
            )
        self.answering = False

    def left(self, endpoint: str) -> asyncio.Event:
        """Set once the client moves on from the member ``endpoint`` (:meth:`fail_over`)."""
        return self._left.setdefault(endpoint, asyncio.Event())

    async def post(
        self,
        op: str,
        path: str,
        body: dict[str, Any],
        *,
        idempotent: bool = True,
        token: bool = True,
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the current member, failing over and retrying.

        ``token``: the request needs our auth token (all but authenticating itself)."""
        if token and self._credentials and self._token is None:
            await self.authenticate()
        backoff = Backoff(self.retry_timeout)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        reauthenticated = False
        while True:
            endpoint = self.endpoints[self._current]
            self.requests += 1
            began = time.monotonic()
            try:
                async with self.session().post(
                    endpoint + path, json=body, headers=self.headers(), timeout=timeout
                ) as response:
                    data = await response.json(content_type=None)
                    status = response.status
            except _TLS_FAILED as exc:
                raise self.tls_refused(endpoint, exc) from exc
            except NOT_SENT as exc:
                problem, silent = f"{endpoint}: {exc}", True
            except MAYBE_SENT as exc:
                if is_tls(exc):
                    raise self.tls_refused(endpoint, exc) from exc
                if not idempotent:
                    raise StoreOutcomeUnknown(
                        f"etcd at {endpoint}: {op} failed ({exc!r}); not resent, it may have "
                        "been applied"
                    ) from exc
                problem, silent = f"{endpoint}: {exc!r}", True
            except aiohttp.ClientConnectionError as exc:
                self.raise_if_closed(endpoint, op, exc)
                raise
            except ValueError as exc:
                raise StoreError(
                    f"etcd at {endpoint}: {path} did not answer JSON; is this "
                    "an etcd v3 client URL?"
                ) from exc
            else:
                code = self.answer_code(endpoint, path, status, data)
                if code == 0:
                    self.answering = True
                    self._silent_at.pop(endpoint, None)
                    if self.observer is not None:
                        self.observer(op, time.monotonic() - began)
                    return data
                message = str(data.get("message") or data.get("error"))
                if code == UNAUTHENTICATED and token and self._credentials and not reauthenticated:
                    await self.authenticate()  # tokens expire; get a new one, once
                    reauthenticated = True
                    continue
                maybe_applied = self.raise_refusal(endpoint, op, code, message)
                if not idempotent and maybe_applied:
                    raise StoreOutcomeUnknown(
                        f"etcd at {endpoint}: {op} failed ({message}); "
                        "not resent, it may have been applied"
                    )
                problem, silent = f"{endpoint}: {message} (gRPC code {code})", False
            self.fail_over(endpoint, problem, silent)
            if not await backoff.pause():
                raise StoreUnavailable(self.unavailable(problem))

    @staticmethod
    def answer_code(endpoint: str, path: str, status: int, data: Any) -> int:
        """The gRPC code of an answer (0: success); not etcd's answer shape is a StoreError."""
        if not isinstance(data, dict):
            raise StoreError(
                f"etcd at {endpoint}: {path} answered {type(data).__name__} JSON; "
                "is this an etcd v3 client URL?"
            )
        code = data.get("code", 0)
        if status != 200 and not code:
            raise StoreError(
                f"etcd at {endpoint}: {path} answered HTTP {status}; is this an "
                "etcd (v3.4 or later) client URL?"
            )
        return int(code)

    @staticmethod
    def raise_refusal(endpoint: str, op: str, code: int, message: str) -> bool:
        """Raise for an error no retry can fix; for one worth retrying, return whether the
        refused request may have been applied all the same."""
        refusal = classify(code, message)
        if refusal.verdict is Verdict.AUTH:
            raise StoreAuthError(
                f"etcd at {endpoint} refused {op}: {message} (set "
                "--rdzv-conf username= and password=)"
            )
        if refusal.verdict is Verdict.REFUSED:
            refused = f"etcd at {endpoint} refused {op}: {message} (gRPC code {code})"
            if code == NOT_FOUND and "lease not found" in message:
                raise LeaseLapsed(refused)
            raise StoreRefused(refused)
        return refusal.maybe_applied

    @staticmethod
    def tls_refused(endpoint: str, exc: Exception) -> StoreAuthError:
        return StoreAuthError(
            f"etcd at {endpoint}: TLS failed: {exc} (check --rdzv-conf "
            "protocol, cacert, cert and key)"
        )

    def unavailable(self, problem: str) -> str:
        hint = ""
        if any(
            text in problem
            for text in ("no leader", "timed out", "leader changed", "deadline exceeded")
        ):
            hint = "; the cluster has no quorum (too few members up?)"
        return f"etcd at {self.where} is unavailable after {self.retry_timeout:g}s: {problem}{hint}"

    async def authenticate(self) -> None:
        """Trade the username and password for a token (etcd's simple tokens expire)."""
        assert self._credentials is not None
        user, password = self._credentials
        self._token = None
        body = {"name": user, "password": password}
        try:
            doc = await self.post("authenticate", "/v3/auth/authenticate", body, token=False)
        except StoreError as exc:
            if "authentication is not enabled" not in str(exc):
                raise StoreAuthError(f"{exc}; user {user!r}") from exc
            log.warning("etcd at %s has authentication off; ignoring username %r", self.where, user)
            self._credentials = None
            return
        self._token = str(doc["token"])

    def raise_if_closed(self, endpoint: str, op: str, exc: BaseException) -> None:
        """A connection error of a request the client was closed under (a shutdown):
        StoreUnavailable, which the store's callers expect, instead of aiohttp's."""
        if self._closed:
            raise StoreUnavailable(f"etcd at {endpoint}: {op}: the client was closed") from exc

    async def close(self) -> None:
        """Close the session: requests under way end with StoreUnavailable, as do later ones."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


def is_tls(exc: BaseException) -> bool:
    """A TLS handshake or certificate failure: no retry can fix it."""
    return isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError) or (
        isinstance(exc, aiohttp.ClientOSError) and "[SSL" in str(exc)
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty prefix (or all 0xff): every key


COUNTER = b"\x00agentd:counted-by-version"
"""The value of a key that ``EtcdStore.add`` counts by etcd's own version of the key (one
transaction per arrival, no contention); readers see the count (:func:`kv_value`)."""


def kv_value(kv: dict[str, Any] | None) -> bytes | None:
    """The value of an etcd key-value in the gateway's JSON (None: no such key); a counted
    key reads as its count."""
    if kv is None:
        return None
    value = base64.b64decode(kv.get("value", ""))
    return str(kv.get("version", "0")).encode() if value == COUNTER else value
