"""Every error answer etcd's v3 JSON gateway gives (etcd's rpctypes, and the gateway's own)
is classified: retried while the cluster recovers, or refused for good."""

from __future__ import annotations

import pytest

from agentd.store.etcd.codes import Verdict, classify, watch_cancel_code

RETRY, AUTH, REFUSED = Verdict.RETRY, Verdict.AUTH, Verdict.REFUSED

ANSWERS = [
    # The cluster's passing state: retried with backoff.
    (2, "context deadline exceeded", RETRY, True),  # the gateway timed out inside etcd
    (2, "transport is closing", RETRY, True),
    (1, "context canceled", RETRY, True),
    (4, "etcdserver: context deadline exceeded", RETRY, True),
    (14, "etcdserver: request timed out", RETRY, True),
    (14, "etcdserver: request timed out, possibly due to previous leader failure", RETRY, True),
    (14, "etcdserver: request timed out, possibly due to connection lost", RETRY, True),
    (14, "etcdserver: leader changed", RETRY, True),
    (14, "etcdserver: no leader", RETRY, False),
    (14, "etcdserver: server stopped", RETRY, False),
    (14, "etcdserver: not capable", RETRY, False),
    (14, "etcdserver: unhealthy cluster", RETRY, False),
    (14, "all SubConns are in TransientFailure", RETRY, True),
    (8, "etcdserver: too many requests", RETRY, False),
    (8, "etcdserver: mvcc: database space exceeded", RETRY, True),
    (9, "etcdserver: not leader", RETRY, False),
    (10, "aborted", RETRY, True),
    (13, "grpc: the client connection is closing", RETRY, True),
    # Our credentials: exit 3, naming them.
    (3, "etcdserver: authentication failed, invalid user ID or password", AUTH, False),
    (3, "etcdserver: user name is empty", AUTH, False),
    (7, "etcdserver: permission denied", AUTH, False),
    (16, "etcdserver: invalid auth token", AUTH, False),
    (16, "etcdserver: user name not found", AUTH, False),
    # The request itself: exit 3.
    (3, "etcdserver: key is not provided", REFUSED, False),
    (3, "etcdserver: too many operations in txn request", REFUSED, False),
    (3, "etcdserver: request is too large", REFUSED, False),
    (3, "etcdserver: duplicate key given in txn request", REFUSED, False),
    (5, "etcdserver: requested lease not found", REFUSED, False),
    (9, "etcdserver: authentication is not enabled", REFUSED, False),
    (9, "etcdserver: lease already exists", REFUSED, False),
    (11, "etcdserver: mvcc: required revision has been compacted", REFUSED, False),
    (11, "etcdserver: mvcc: required revision is a future revision", REFUSED, False),
    (12, "unknown service etcdserverpb.KV", REFUSED, False),
    (15, "etcdserver: corrupt cluster", REFUSED, False),
]


@pytest.mark.parametrize(("code", "message", "verdict", "maybe_applied"), ANSWERS)
def test_each_gateway_answer_is_classified(code, message, verdict, maybe_applied):
    refusal = classify(code, message)
    assert (refusal.verdict, refusal.maybe_applied) == (verdict, maybe_applied)
    assert (refusal.code, refusal.message) == (code, message)


def test_every_grpc_code_has_a_verdict():
    verdicts = {code: classify(code, "").verdict for code in range(1, 17)}
    assert {c for c, v in verdicts.items() if v is RETRY} == {1, 2, 4, 8, 10, 13, 14}
    assert {c for c, v in verdicts.items() if v is AUTH} == {7, 16}


@pytest.mark.parametrize(
    ("reason", "verdict"),
    [
        ("etcdserver: permission denied", AUTH),
        ("rpctypes: invalid auth token", AUTH),
        ("etcdserver: no leader", RETRY),
        ("", RETRY),
    ],
)
def test_a_cancelled_watch_is_classified_by_its_reason(reason, verdict):
    assert classify(watch_cancel_code(reason), reason).verdict is verdict
