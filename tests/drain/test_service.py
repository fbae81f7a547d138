"""One agent's drain service on a real (in-memory) store: which requests it follows."""

from __future__ import annotations

import asyncio

from agentd.drain.service import DrainService
from agentd.drain.settings import DrainSettings
from agentd.rendezvous.drains import Drains
from agentd.rendezvous.keys import RunKeys
from agentd.store.memory import MemoryStore
from agentd.wire import control


async def test_a_request_left_by_a_node_gone_from_the_round_is_not_followed(tmp_path):
    """Node a's agent died during its drain and the others re-formed without it. Its
    request stood on: every agent followed it, pausing its workers for a step long passed
    and holding its hang detection, and a new drain joined it."""
    store = MemoryStore()
    members = ["a", "b", "c"]

    async def current_round() -> list[str]:
        return members

    def node(name: str) -> Drains:
        return Drains(lambda: store, RunKeys("job"), name, current_round)

    dead, _ = await node("a").request("preempted", 60)
    members = ["b", "c"]  # re-formed without a
    followed: list[str] = []
    holds: list[float | None] = []
    watching, read = node("b"), asyncio.Event()
    real_current = watching.current

    async def current() -> tuple:
        found = await real_current()
        read.set()  # the service has read what stands
        return found

    watching.current = current  # type: ignore[method-assign]
    service = DrainService(
        DrainSettings(),
        watching,
        dict,
        lambda *leave: None,
        lambda hook, doc=None: followed.append(doc["node"]) if hook == "drain_requested" else None,
        holds.append,
    )
    path = str(tmp_path / "drain.control")
    control.create(path)
    service.attempt(path)
    service.workers_started()
    try:
        await asyncio.wait_for(read.wait(), 10)
        live, joined = await node("c").request("maintenance", 60)
        assert not joined and live.id != dead.id
        async with asyncio.timeout(10):
            while not followed or followed[-1] != "c":
                await asyncio.sleep(0.01)
        assert followed == ["c"] and len(holds) == 1
    finally:
        await service.stop()
        await store.close()
