"""``POST /drain`` on the health endpoint, and ``agentd drain``, its client.

The request needs the drain token (``Authorization: Bearer <token>``): ``--drain-token``
(``AGENTD_DRAIN_TOKEN``) when the operator gives one, else one the agent made and published
for its user only (see :mod:`agentd.store.token_file`, kind ``health``). Never the store's
token: the health port is often plain HTTP on every address, and a drain request must not
carry the secret that guards the store. The body is
optional: ``{"reason": "..."}`` (at most 200 characters). Answers 202 with what the agent
does, 401 without the right token, 400 naming what is wrong with the body.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.support.bearer import bearer_ok

if TYPE_CHECKING:
    from aiohttp import web

DRAIN_TOKEN_ENV = "AGENTD_DRAIN_TOKEN"
MAX_BODY = 4096
MAX_REASON = 200


async def drain_response(
    request: web.Request, token: str | None, drain: Callable[[str], dict[str, Any]]
) -> web.Response:
    from aiohttp import web

    if not bearer_ok(request.headers.get("Authorization", ""), token):
        return web.json_response(
            {"error": "POST /drain needs the bearer token (Authorization: Bearer <token>)"},
            status=401,
        )
    body = await request.content.read(MAX_BODY + 1)
    reason = "POST /drain"
    if body.strip():
        try:
            doc = json.loads(body) if len(body) <= MAX_BODY else None
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            return web.json_response(
                {"error": f"body: must be a JSON object of at most {MAX_BODY} bytes"}, status=400
            )
        if unknown := sorted(set(doc) - {"reason"}):  # a typo must not drain unreasoned
            return web.json_response(
                {"error": f"{unknown[0]}: not a field of POST /drain (it takes: reason)"},
                status=400,
            )
        given_reason = doc.get("reason", reason)
        if not isinstance(given_reason, str) or not 0 < len(given_reason) <= MAX_REASON:
            return web.json_response(
                {
                    "error": f"reason: {given_reason!r} must be a non-empty "
                    f"string of at most {MAX_REASON} characters"
                },
                status=400,
            )
        reason = given_reason
    return web.json_response(drain(reason), status=202)


def run(url: str | None, reason: str | None, timeout: float, cacert: str | None = None) -> int:
    """``agentd drain``: 0 the agent drains, 1 it refused, 3 it cannot be reached."""
    from agentd.store import token_file
    from agentd.support.agent_url import base_url, tls_context

    base = base_url(url, dict(os.environ))
    token = token_file.for_agent(base, os.environ.get(DRAIN_TOKEN_ENV))
    body = json.dumps({"reason": reason} if reason else {}).encode()
    request = urllib.request.Request(
        base + "/drain",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token or ''}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(
            request, timeout=timeout, context=tls_context(base, cacert)
        ) as response:
            sys.stdout.write(response.read().decode().strip() + "\n")
            return 0
    except urllib.error.HTTPError as exc:
        sys.stderr.write(
            f"agentd: error: drain refused ({exc.code}): {exc.read().decode().strip()}\n"
        )
        return 1
    except (OSError, ValueError) as exc:
        sys.stderr.write(
            f"agentd: error: cannot reach the agent at {base}: {getattr(exc, 'reason', exc)}\n"
        )
        return 3
