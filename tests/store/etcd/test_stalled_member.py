"""A stalled etcd member (SIGSTOP: a disk that stalls, a paused VM): the requests waiting
on it time out, and the client moves on to the next member once, however many were waiting.

Before: each request that timed out moved the client one member on, so three of them took
it past both members that answered and back to the stalled one."""

from __future__ import annotations

import asyncio

from agentd.store.etcd.store import EtcdStore
from tests.helpers.etcd_server import EtcdCluster, require_etcd


async def test_requests_stalled_on_one_member_move_on_to_the_next_once(tmp_path):
    require_etcd()
    with EtcdCluster(tmp_path / "etcd", size=3) as cluster:
        store = EtcdStore(cluster.urls, request_timeout=0.5)
        try:
            await store.set("key", b"value")
            sent = store.requests
            with cluster.stalled(0):
                values = await asyncio.gather(*(store.get("key") for _ in range(3)))
            assert values == [b"value"] * 3
            # three sent to the stalled member, three answered by the next: none went back
            assert store.requests - sent == 6
        finally:
            await store.close()
