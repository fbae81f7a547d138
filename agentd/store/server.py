"""The embedded store server: a :class:`MemoryStore` over HTTP (aiohttp), for rendezvous.

``POST /v1/<op>`` with a JSON body; values travel as base64. Bearer-token auth (required
when binding anything but loopback); bounded key, value and body sizes; every bad
request gets a 4xx with ``{"error": "..."}`` and changes nothing. Long polls (``wait``,
``watch``) are capped at :data:`MAX_POLL` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.exceptions import ConfigError, StartError
from agentd.http_site import Limits, serve_app
from agentd.ratelog import RateLimitedLog
from agentd.store import token_file
from agentd.store.api import StoreError, StoreFull, StoreNotServing, StoreTimeout, WatchResult
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import CANDIDATES_HEADER, NOT_SERVING, TERM_HEADER
from agentd.store.memory import MemoryStore

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

MAX_KEY = 1024
MAX_VALUE = 1 << 20
MAX_BODY = 4 << 20
MAX_KEYS = 4096
MAX_POLL = 60.0
MAX_TTL = 86400.0
MAX_CONNECTIONS = 4096
"""About three per agent at once (a long poll, a heartbeat, an operation): 1,000+ agents."""
LIMITS = Limits(max_connections=MAX_CONNECTIONS, idle_timeout=10.0, body_timeout=10.0)
"""The idle timeout is longer than clients keep an idle connection (http_client.KEEPALIVE),
so a connection is never reused just as the server closes it."""
INSTANCE_HEADER = "Agentd-Store-Instance"


class BadRequest(ValueError):
    """A request broke a rule; the message names the field, the value and the rule."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever means this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StoreServer:
    """Serves a :class:`MemoryStore` on ``host:port`` (port 0: an ephemeral one).

    Every request needs the bearer ``token``. Without one, the server makes its own (only
    on loopback) and publishes it for this user's clients on this host, from the moment it
    listens until it stops (see :mod:`agentd.store.token_file`).

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
    ) -> None:
        if not token and not is_loopback(host):
            raise ConfigError(
                f"store_token: required when the store binds {host!r}, which is not loopback "
                "(set --store-token or AGENTD_STORE_TOKEN)"
            )
        self.host = host
        self.port = port
        self._given_token = bool(token)
        self.token = token or token_file.new_token()
        self._token = self.token.encode()
        self.token_file: Path | None = None
        """Where the token this server made is published (None: the user gave one)."""
        self.store = store or MemoryStore()
        self.instance = os.urandom(8).hex()
        """Names this server's state: clients see a restart (state lost) when it changes."""
        self.candidacy = candidacy
        if candidacy is not None:
            candidacy.on_promote = self._fresh_store
            candidacy.on_step_down = self._drop_store
        self._runner: web.AppRunner | None = None
        self._problems = RateLimitedLog(log)
        self._limits = dataclasses.replace(limits, max_connections=max_connections)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        from aiohttp import web

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> Any:
            return await self._guard(request, handler)

        app = web.Application(client_max_size=MAX_BODY, middlewares=[guard])
        app.router.add_post("/v1/{op}", self._dispatch)
        self._runner, self.port = await serve_app(app, self.host, self.port, "store",
                                                  self._limits)  # fmt: skip
        if not self._given_token:
            try:
                self.token_file = token_file.publish(self.port, self.token)
            except (OSError, StartError) as exc:
                await self.stop()
                raise StartError(f"store token: cannot publish it: {exc}") from None
        log.info("Store listening on http://%s%s", self.endpoint,
                 f" (its token in {self.token_file}, for this user only)"
                 if self.token_file else "")  # fmt: skip

    def _fresh_store(self) -> None:
        candidacy = self.candidacy
        assert candidacy is not None
        self.store = MemoryStore(on_lapse=candidacy.suspect)
        self.instance = os.urandom(8).hex()

    async def _drop_store(self) -> None:
        await self.store.close()

    async def stop(self) -> None:
        if self.candidacy is not None:
            await self.candidacy.close()
        if self.token_file is not None:
            token_file.withdraw(self.port, self.token)
            self.token_file = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.store.close()

    # -- request handling --------------------------------------------------------------------

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        from aiohttp import web

        return web.json_response({"error": message}, status=status)

    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> Any:
        """Auth first, then the handler, with every failure turned into a 4xx JSON error."""
        from aiohttp import web

        if not self._authorized(request):
            return self._error(401, "authorization: a valid bearer token is required")
        candidacy = self.candidacy
        try:
            if candidacy is not None:
                mismatch = candidacy.mismatch(request.headers.get(CANDIDATES_HEADER))
                if mismatch:
                    return web.json_response({"error": mismatch, "mismatch": True}, status=409)
                candidacy.observe(_term(request.headers.get(TERM_HEADER, "0")))
                response = await handler(request)
                response.headers[TERM_HEADER] = str(candidacy.term)
                return response
            return await handler(request)
        except StoreNotServing as exc:
            return self._error(NOT_SERVING, str(exc))
        except BadRequest as exc:
            return self._error(400, str(exc))
        except StoreTimeout as exc:
            return self._error(408, str(exc))
        except StoreFull as exc:
            self._problems.warning("full", "Store: %s", exc)
            return self._error(507, str(exc))
        except StoreError as exc:
            return self._error(409, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, f"body: larger than {MAX_BODY} bytes")
        except web.HTTPException as exc:
            return self._error(exc.status, exc.reason)
        except Exception as exc:  # a bug, not the client's fault: one line, never a traceback
            self._problems.error("internal", "Store: %s failed: %r", request.path, exc)
            return self._error(500, f"internal error: {type(exc).__name__}")

    def _authorized(self, request: web.Request) -> bool:
        """The request carries our bearer token (compared in constant time, as bytes: a
        header of undecodable bytes is simply not our token)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.encode("utf-8", "surrogateescape")
        return scheme == "Bearer" and hmac.compare_digest(given, self._token)

    async def _dispatch(self, request: web.Request) -> web.Response:
        from aiohttp import web

        op = request.match_info["op"]
        method = _OPS.get(op)
        candidacy = self.candidacy
        if candidacy is not None and op in ("role", "promote"):
            if op == "promote":
                try:
                    body = json.loads(await request.read() or b"{}")
                except (ValueError, UnicodeDecodeError):
                    raise BadRequest("body: not valid JSON") from None
                candidacy.promote(_Args(body if isinstance(body, dict) else {}).integer("term"))
            return web.json_response(candidacy.document())
        if method is None:
            return self._error(404, f"op: {op!r} is not one of {sorted(_OPS)}")
        if candidacy is not None and not candidacy.serving:
            raise StoreNotServing(candidacy.not_serving_message())
        timeout = self._limits.body_timeout
        try:
            async with asyncio.timeout(timeout):
                raw = await request.read()
        except TimeoutError:
            response = self._error(408, f"body: not received within {timeout:g}s")
            response.force_close()  # the rest of the body may still come: not on this connection
            return response
        try:
            body = json.loads(raw) if raw else {}
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("body: not valid JSON") from None
        except RecursionError:
            raise BadRequest("body: JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("body: must be a JSON object")
        seen = body.get("instance")
        if op == "watch" and seen is not None and seen != self.instance:
            # the client's revisions are another store's (we restarted): a long poll on them
            # could wait for changes that will never come, so say so at once
            lost = WatchResult(await self.store.revision(), compacted=True)
            return web.json_response(_watch_doc(lost), headers={INSTANCE_HEADER: self.instance})
        instance = self.instance
        if candidacy is not None:
            result = await candidacy.while_serving(method(self.store, _Args(body)))
        else:
            result = await method(self.store, _Args(body))
        return web.json_response(result, headers={INSTANCE_HEADER: instance})


class _Args:
    """Typed access to a request body; every problem is a BadRequest naming the field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def key(self, name: str = "key") -> str:
        value = self._body.get(name)
        if not isinstance(value, str) or not 1 <= _utf8_size(name, value) <= MAX_KEY:
            raise BadRequest(f"{name}: {_show(value)} must be a string of 1..{MAX_KEY} bytes")
        return value

    def keys(self) -> list[str]:
        value = self._body.get("keys")
        if not isinstance(value, list) or len(value) > MAX_KEYS:
            raise BadRequest(f"keys: must be a list of at most {MAX_KEYS} keys")
        return [_Args({"key": k}).key() for k in value]

    def value(self, name: str = "value", optional: bool = False) -> bytes | None:
        value = self._body.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise BadRequest(f"{name}: {_show(value)} must be a base64 string")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{name}: {_show(value)} is not valid base64") from None
        if len(data) > MAX_VALUE:
            raise BadRequest(f"{name}: {len(data)} bytes is more than {MAX_VALUE}")
        return data

    def items(self) -> dict[str, bytes]:
        value = self._body.get("items")
        if not isinstance(value, dict) or len(value) > MAX_KEYS:
            raise BadRequest(f"items: must be an object of at most {MAX_KEYS} keys")
        out = {}
        for key, raw in value.items():
            args = _Args({"key": key, "value": raw})
            out[args.key()] = args.value() or b""
        return out

    def number(self, name: str, low: float, high: float, default: float | None = None) -> float:
        value = self._body.get(name, default)
        # compared before any float conversion: a 400-digit integer must not overflow
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not (low <= value <= high)
        ):
            raise BadRequest(f"{name}: {_show(value)} must be a number within {low:g}..{high:g}")
        return float(value)

    def ttl(self) -> float | None:
        if self._body.get("ttl") is None:
            return None
        return self.number("ttl", 0.001, MAX_TTL)

    def integer(self, name: str) -> int:
        value = self._body.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) >= 2**63:
            raise BadRequest(f"{name}: {_show(value)} must be a 64-bit integer")
        return value


def _term(text: str) -> int:
    if not text.isdigit() or len(text) > 18:
        raise BadRequest(f"{TERM_HEADER}: {_show(text)} must be a non-negative integer")
    return int(text)


def _utf8_size(name: str, text: str) -> int:
    """The UTF-8 size of ``text``; a string that has none (a lone surrogate) is refused."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        problem = "is not valid Unicode (a lone surrogate?)"
        raise BadRequest(f"{name}: {_show(text)} {problem}") from None


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _watch_doc(result: WatchResult) -> dict[str, Any]:
    return {
        "revision": result.revision,
        "compacted": result.compacted,
        "events": [{"key": e.key, "value": _b64(e.value), "revision": e.revision}
                   for e in result.events],
    }  # fmt: skip


async def _set(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"revision": await store.set(a.key(), a.value() or b"", a.ttl())}


async def _get(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"value": _b64(await store.get(a.key()))}


async def _add(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"value": await store.add(a.key(), a.integer("delta"))}


async def _compare_set(store: MemoryStore, a: _Args) -> dict[str, Any]:
    ok, current = await store.compare_set(
        a.key(), a.value("expected", optional=True), a.value("desired") or b"", a.ttl()
    )
    return {"succeeded": ok, "value": _b64(current)}


async def _refresh(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"refreshed": await store.refresh(a.key(), a.number("ttl", 0.001, MAX_TTL))}


async def _multi_get(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"values": [_b64(v) for v in await store.multi_get(a.keys())]}


async def _multi_set(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"revision": await store.multi_set(a.items(), a.ttl())}


async def _delete(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"deleted": await store.delete(a.key())}


async def _delete_prefix(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"deleted": await store.delete_prefix(a.key("prefix"))}


async def _num_keys(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"count": await store.num_keys()}


async def _revision(store: MemoryStore, a: _Args) -> dict[str, Any]:
    return {"revision": await store.revision()}


async def _wait(store: MemoryStore, a: _Args) -> dict[str, Any]:
    await store.wait(a.keys(), a.number("timeout", 0, MAX_POLL))
    return {}


async def _watch(store: MemoryStore, a: _Args) -> dict[str, Any]:
    prefix = a._body.get("prefix", "")
    if not isinstance(prefix, str) or _utf8_size("prefix", prefix) > MAX_KEY:
        raise BadRequest(f"prefix: {_show(prefix)} must be a string of at most {MAX_KEY} bytes")
    after = a.integer("after_revision")
    return _watch_doc(await store.watch(prefix, after, a.number("timeout", 0, MAX_POLL)))


_OPS: dict[str, Callable[[MemoryStore, _Args], Awaitable[dict[str, Any]]]] = {
    "set": _set,
    "get": _get,
    "add": _add,
    "compare_set": _compare_set,
    "refresh": _refresh,
    "multi_get": _multi_get,
    "multi_set": _multi_set,
    "delete": _delete,
    "delete_prefix": _delete_prefix,
    "num_keys": _num_keys,
    "revision": _revision,
    "wait": _wait,
    "watch": _watch,
}
