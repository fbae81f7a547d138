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

A request with the :data:`FOLLOW_HEADER` header is a follower's (``agentd logs
--follow``): the agent's end waits for it (:class:`Followers`).

A malformed query is a 400 naming the field, its value and the rule.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.joblogs.reader import LogReader
from agentd.support.bearer import bearer_ok

if TYPE_CHECKING:
    from aiohttp import web

MAX_CURSOR = 64 * 1024
"""The longest cursor accepted (characters): thousands of log files."""


class BadQuery(ValueError):
    """A query field that cannot be read: the message names it."""


QUERY = ("cursor", "since", "rank")
"""The parameters of ``GET /logs``."""
FOLLOW_HEADER = "Agentd-Follow"
"""Sent (``1``) by ``agentd logs --follow``, which asks again every second: a header,
not a parameter, which an agent of a version before it would refuse."""
FOLLOWED_WITHIN = 3.0
"""A follower that asked this recently is still following (it asks every second): the
agent's end waits for it until this long after its last request."""


class Followers:
    """Whether the agent's run has ended, and the followers of its lines: its end
    (:meth:`end`) waits for a follower still following to be answered that the lines
    ended, at most until :data:`FOLLOWED_WITHIN` after its last request (one gone, a
    Ctrl-C, asks no more). Without that wait the endpoint closed with the agent, and a
    follower lost the lines of the last second or two and ended in an error ("cannot
    reach"), though the job had ended well."""

    def __init__(self) -> None:
        self.ended = False
        self._seen: float | None = None
        self._told = asyncio.Event()

    def asked(self, follower: bool) -> bool:
        """A request came (from a follower, or not): whether the run had ended before
        it was read (so that no line written after the read is missed)."""
        if follower:
            self._seen = time.monotonic()
        return self.ended

    def answered(self, follower: bool, ended: bool, more: bool) -> None:
        if follower and ended and not more:
            self._told.set()

    async def end(self) -> None:
        """The run is over: answer so from now on, and wait for a recent follower."""
        self.ended = True
        if self._seen is None:
            return
        left = self._seen + FOLLOWED_WITHIN - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._told.wait(), left)


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
    follower = request.headers.get(FOLLOW_HEADER) == "1"
    ended = followers.asked(follower)
    current = attempt()
    running = current + 1 if ended else current  # ended: the last attempt's lines are whole
    lines, after, more = await asyncio.to_thread(reader.read, cursor, running, since, rank)
    followers.answered(follower, ended, more)
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
