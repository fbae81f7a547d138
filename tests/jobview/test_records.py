"""The status records in each kind of store: the embedded one (in process and over HTTP)
and etcd. One write per member; one read gives the round's records and its spares."""

from __future__ import annotations

from agentd.rendezvous.job_records import JobRecords
from agentd.rendezvous.keys import RunKeys
from agentd.store.api import Store
from tests.store.test_contract import store  # noqa: F401 (the fixture: memory, http, etcd)


async def test_records_are_read_in_one_request_with_the_spares(store: Store):  # noqa: F811
    keys = RunKeys("job")
    job = JobRecords(lambda: store, keys, "node-a", "10.0.0.1")
    await job.publish(3, 0, {"node": "node-a", "at": 1.0}, ttl=30)
    await job.publish(3, 2, {"node": "node-c", "at": 2.0}, ttl=30)
    await job.publish(2, 1, {"node": "old", "at": 0.5}, ttl=30)  # an earlier round's
    await store.set(keys.round(3, "join"), b"5")  # 3 members and 2 agents come since
    records, spares = await job.gather(3, 3)
    assert records == {0: {"node": "node-a", "at": 1.0}, 2: {"node": "node-c", "at": 2.0}}
    assert spares == 2
    assert await job.gather(4, 2) == ({}, 0)
