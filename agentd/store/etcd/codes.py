"""What an error answer of etcd's JSON gateway means for the request: retry it, or give up.

The gateway puts a gRPC status ``code`` and a ``message`` in the body of an error answer
(its HTTP status says little). etcd maps its own errors to codes (``rpctypes``), and the
gateway adds some of its own: a request that timed out *inside* the gateway, say while the
cluster had no quorum, comes back as code 2 (Unknown) "context deadline exceeded".

The rule: a refusal is permanent only when the request itself is at fault — credentials,
permissions, an invalid request, a revision compacted away, a feature the server lacks.
Everything else (no leader, leader changed, request timed out, too many requests, a full
database an operator can free, an unavailable member, the gateway's own failures) is the
cluster's state, which changes: those are retried with backoff, like a connection failure,
for as long as the caller's retry budget allows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

_TRANSIENT_CODES = {
    CANCELLED,
    UNKNOWN,
    DEADLINE_EXCEEDED,
    RESOURCE_EXHAUSTED,
    ABORTED,
    INTERNAL,
    UNAVAILABLE,
}
_TRANSIENT_PRECONDITIONS = ("not leader", "leader changed", "no leader")
"""FailedPrecondition is mostly permanent, but a lease request at a follower that lost its
leader says "not leader": another member, or the same one a moment later, can serve it."""
_AUTH_ARGUMENTS = ("user name", "authenticat", "password")
"""InvalidArgument that is about credentials ("user name is empty", "authentication failed,
invalid user ID or password")."""
_NEVER_PROPOSED = (
    "no leader",
    "not leader",
    "too many requests",
    "not capable",
    "server stopped",
    "unhealthy cluster",
)
"""Transient refusals given before the request reached raft: it was certainly not applied.
Any other transient answer (a timeout above all) may come after etcd applied it."""


class Verdict(enum.Enum):
    """What to do with a request etcd refused."""

    RETRY = "retry"
    """The cluster's state: retry with backoff, on the next member."""
    AUTH = "auth"
    """Our credentials or permissions: no retry can fix it (exit 3, naming them)."""
    REFUSED = "refused"
    """The request itself: no retry can fix it (exit 3)."""


@dataclass(frozen=True)
class Refusal:
    """One classified error answer."""

    code: int
    message: str
    verdict: Verdict
    maybe_applied: bool
    """A write refused this way may still have been applied (so resend only idempotent ones)."""


def classify(code: int, message: str) -> Refusal:
    """Classify the gateway's error answer ``code`` / ``message`` (``code`` is not 0)."""
    text = message.lower()
    if code in (UNAUTHENTICATED, PERMISSION_DENIED) or (
        code == INVALID_ARGUMENT and any(word in text for word in _AUTH_ARGUMENTS)
    ):
        verdict = Verdict.AUTH
    elif code in _TRANSIENT_CODES or (
        code == FAILED_PRECONDITION and any(word in text for word in _TRANSIENT_PRECONDITIONS)
    ):
        verdict = Verdict.RETRY
    else:
        verdict = Verdict.REFUSED
    maybe_applied = verdict is Verdict.RETRY and not any(p in text for p in _NEVER_PROPOSED)
    return Refusal(code, message, verdict, maybe_applied)


def watch_cancel_code(reason: str) -> int:
    """The code a watch cancelled with ``reason`` (text only, no code) stands for."""
    text = reason.lower()
    if "permission denied" in text:
        return PERMISSION_DENIED
    if "auth" in text:
        return UNAUTHENTICATED
    return UNAVAILABLE
