"""The store's operations over HTTP: each request body checked field by field, then the
:class:`MemoryStore` call it names. Every broken rule is a :class:`BadRequest` naming the
field, the value and the rule; nothing is changed then."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from agentd.store.api import WatchResult
from agentd.store.memory import MemoryStore
from agentd.store.wire import MAX_KEYS, MAX_POLL, MAX_PRESENT, TERM_HEADER, b64

MAX_KEY = 1024
MAX_VALUE = 1 << 20
MAX_TTL = 86400.0


class BadRequest(ValueError):
    """A request broke a rule; the message names the field, the value and the rule."""


class Args:
    """Typed access to a request body; every problem is a BadRequest naming the field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def key(self, name: str = "key") -> str:
        value = self._body.get(name)
        if not isinstance(value, str) or not 1 <= _utf8_size(name, value) <= MAX_KEY:
            raise BadRequest(f"{name}: {_show(value)} must be a string of 1..{MAX_KEY} bytes")
        return value

    def keys(self, name: str = "keys", limit: int = MAX_KEYS, optional: bool = False) -> list[str]:
        value = self._body.get(name)
        if value is None and optional:
            return []
        if not isinstance(value, list) or len(value) > limit:
            raise BadRequest(f"{name}: must be a list of at most {limit} keys")
        return [Args({name: k}).key(name) for k in value]

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
            args = Args({"key": key, "value": raw})
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


def term_header(text: str) -> int:
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


def watch_doc(result: WatchResult) -> dict[str, Any]:
    return {
        "revision": result.revision,
        "compacted": result.compacted,
        "events": [
            {"key": e.key, "value": b64(e.value), "revision": e.revision} for e in result.events
        ],
    }


async def _set(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"revision": await store.set(a.key(), a.value() or b"", a.ttl())}


async def _get(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"value": b64(await store.get(a.key()))}


async def _add(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"value": await store.add(a.key(), a.integer("delta"))}


async def _add_once(store: MemoryStore, a: Args) -> dict[str, Any]:
    counted, total = await store.add_once(
        a.key("counter"),
        a.key("marker"),
        a.value("mark") or b"",
        a.keys("absent", MAX_PRESENT, optional=True),
    )
    return {"counted": counted, "value": total}


async def _compare_set(store: MemoryStore, a: Args) -> dict[str, Any]:
    ok, current = await store.compare_set(
        a.key(),
        a.value("expected", optional=True),
        a.value("desired") or b"",
        a.ttl(),
        a.keys("present", MAX_PRESENT, optional=True),
        a.keys("absent", MAX_PRESENT, optional=True),
    )
    return {"succeeded": ok, "value": b64(current)}


async def _refresh(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"refreshed": await store.refresh(a.key(), a.number("ttl", 0.001, MAX_TTL))}


async def _multi_get(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"values": [b64(v) for v in await store.multi_get(a.keys())]}


async def _multi_set(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"revision": await store.multi_set(a.items(), a.ttl())}


async def _delete(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"deleted": await store.delete(a.key())}


async def _delete_prefix(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"deleted": await store.delete_prefix(a.key("prefix"))}


async def _num_keys(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"count": await store.num_keys()}


async def _revision(store: MemoryStore, a: Args) -> dict[str, Any]:
    return {"revision": await store.revision()}


async def _wait(store: MemoryStore, a: Args) -> dict[str, Any]:
    await store.wait(a.keys(), a.number("timeout", 0, MAX_POLL))
    return {}


async def _watch(store: MemoryStore, a: Args) -> dict[str, Any]:
    prefix = a._body.get("prefix", "")
    if not isinstance(prefix, str) or _utf8_size("prefix", prefix) > MAX_KEY:
        raise BadRequest(f"prefix: {_show(prefix)} must be a string of at most {MAX_KEY} bytes")
    after = a.integer("after_revision")
    return watch_doc(await store.watch(prefix, after, a.number("timeout", 0, MAX_POLL)))


OPS: dict[str, Callable[[MemoryStore, Args], Coroutine[Any, Any, dict[str, Any]]]] = {
    "set": _set,
    "get": _get,
    "add": _add,
    "add_once": _add_once,
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


Item = tuple[str, bytes, float | None]
"""A key, its value and the seconds its TTL has left (None: no TTL)."""


def encode_items(items: Sequence[Item]) -> list[list[Any]]:
    """A snapshot as ``inherit`` carries it: ``[key, base64 value, seconds left or None]``."""
    return [[key, b64(value), ttl] for key, value, ttl in items]


def decode_items(value: Any) -> list[Item]:
    """An ``inherit`` request's ``items``, or a :class:`BadRequest` naming what is wrong."""
    if not isinstance(value, list):
        raise BadRequest("items: must be a list of [key, base64 value, ttl or null]")
    items: list[Item] = []
    for index, entry in enumerate(value):
        where = f"items[{index}]"
        if not (isinstance(entry, list) and len(entry) == 3):
            raise BadRequest(f"{where}: {str(entry)[:80]!r} is not [key, base64 value, ttl]")
        key, raw, ttl = entry
        if not isinstance(key, str) or not key:
            raise BadRequest(f"{where}: key {str(key)[:80]!r} must be a non-empty string")
        try:
            data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None:
            raise BadRequest(f"{where}: value of {key!r} must be base64")
        if ttl is not None and not (
            isinstance(ttl, int | float) and not isinstance(ttl, bool) and math.isfinite(ttl)
        ):
            raise BadRequest(f"{where}: ttl of {key!r} is {ttl!r}, not a number of seconds")
        items.append((key, data, None if ttl is None else max(0.0, float(ttl))))
    return items
