"""``GET /logs`` on the health endpoint: this agent's worker lines, for ``agentd logs``.

Logs can hold secrets, so the request needs the health endpoint's token, as ``POST
/drain`` does (``Authorization: Bearer <token>``; 401 without it). Query, each optional:
``cursor`` (what an earlier answer gave: read on from there), ``since`` (epoch seconds:
lines from then on), ``rank`` (one global rank). The answer::

    {"node": ..., "host": ..., "attempt": <current>, "files": <log files>,
     "lines": [[at, attempt, rank, local_rank, stream, text], ...],   # in time order
     "cursor": "...", "more": <bool: ask again from cursor at once>,
     "ended": <bool: the agent's run is over: once "more" is false, no line will come>,
     "keeps_files": <bool: its workers' output goes to files (--tee or --redirects)>,
     "placed_by": <the log specs class, where the user's chose the paths: no lines here>}

A request with the :data:`~agentd.support.followers.FOLLOW_HEADER` header is a
follower's (``agentd logs --follow``): the agent's end waits for it to be told that the
lines ended (:class:`~agentd.support.followers.Followers`).

A malformed query is a 400 naming the field, its value and the rule.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.joblogs.reader import LogReader
from agentd.support.bearer import bearer_ok
from agentd.support.followers import Followers, follow_interval

if TYPE_CHECKING:
    from aiohttp import web

MAX_CURSOR = 64 * 1024
"""The longest cursor accepted (characters): thousands of log files."""


class BadQuery(ValueError):
    """A query field that cannot be read: the message names it."""


QUERY = ("cursor", "since", "rank")
"""The parameters of ``GET /logs``."""


def encode_cursor(cursor: dict[str, int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cursor, separators=(",", ":")).encode()).decode()


def decode_cursor(text: str) -> dict[str, int]:
    shown = text if len(text) <= 40 else text[:37] + "..."
    if len(text) > MAX_CURSOR:
        raise BadQuery(f"cursor: {len(text)} characters is more than {MAX_CURSOR}")
    try:
        doc = json.loads(base64.urlsafe_b64decode(text.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadQuery(f"cursor: {shown!r} is not a cursor an earlier answer gave") from None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in doc.items()
    ):
        raise BadQuery(f"cursor: {shown!r} is not a cursor an earlier answer gave")
    return doc


def parse_query(query: Any) -> tuple[dict[str, int], float | None, int | None]:
    """``cursor``, ``since`` and ``rank`` from a request's query (BadQuery naming one, or
    naming a parameter that is none of them: ``rnak=3`` would read every rank's lines)."""
    if unknown := sorted(set(query) - set(QUERY)):
        raise BadQuery(f"{unknown[0]}: not a parameter of GET /logs (it takes: {', '.join(QUERY)})")
    cursor = decode_cursor(query["cursor"]) if query.get("cursor") else {}
    since = None
    if query.get("since") is not None:
        try:
            since = float(query["since"])
        except ValueError:
            since = math.nan
        if not math.isfinite(since) or since < 0:
            raise BadQuery(f"since: {query['since']!r} must be a time in epoch seconds")
    rank = None
    if query.get("rank") is not None:
        text = query["rank"]
        if not text.isdigit() or len(text) > 9:
            raise BadQuery(f"rank: {text!r} must be a global rank (an integer >= 0)")
        rank = int(text)
    return cursor, since, rank


async def logs_response(
    request: web.Request,
    token: str | None,
    reader: LogReader,
    attempt: Callable[[], int],
    who: Callable[[], dict[str, Any]],
    followers: Followers,
) -> web.Response:
    """Answer one ``GET /logs`` (see the module docstring)."""
    from aiohttp import web

    if not bearer_ok(request.headers.get("Authorization", ""), token):
        return web.json_response(
            {"error": "GET /logs needs the bearer token (Authorization: Bearer <token>)"},
            status=401,
        )
    try:
        cursor, since, rank = parse_query(request.query)
    except BadQuery as exc:
        return web.json_response({"error": str(exc)}, status=400)
    every = follow_interval(request.headers)
    ended = followers.asked(every)
    current = attempt()
    running = current + 1 if ended else current  # ended: the last attempt's lines are whole
    lines, after, more = await asyncio.to_thread(reader.read, cursor, running, since, rank)
    if every is not None and ended and not more:
        followers.told()
    doc = {
        **who(),
        "attempt": current,
        "files": reader.files,
        "lines": [list(line) for line in lines],
        "cursor": encode_cursor(after),
        "more": more,
        "ended": ended,
    }
    return web.json_response(doc)
