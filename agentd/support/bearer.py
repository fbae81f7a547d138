"""The check of a bearer token on a token-guarded request (``POST /drain``, ``GET /logs``)."""

from __future__ import annotations

import hmac


def bearer_ok(authorization: str, token: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (in constant time; never
    with no token set)."""
    given = authorization.encode("utf-8", "surrogateescape")
    return bool(token) and hmac.compare_digest(given, f"Bearer {token}".encode())
