"""One agent's drain service on a real (in-memory) store: which requests it follows."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from types import SimpleNamespace

from agentd.drain.service import DrainService
from agentd.drain.settings import DrainSettings
from agentd.rendezvous.drains import Drains
from agentd.rendezvous.keys import RunKeys
from agentd.store.api import StoreUnavailable
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


async def test_a_node_whose_workers_are_done_acknowledges_at_once(tmp_path):
    """Its workers succeeded (it waits in the exit barrier): none can save, and the
    draining node waited out --drain-timeout (60 s) for its word."""
    store = MemoryStore()

    async def current_round() -> list[str]:
        return ["a", "b"]

    def node(name: str) -> Drains:
        return Drains(lambda: store, RunKeys("job"), name, current_round)

    done = SimpleNamespace(pid=os.getpid(), local_rank=0, returncode=0)
    service = DrainService(
        DrainSettings(), node("b"), lambda: {0: done}, lambda *a: None, lambda *a: None
    )
    path = str(tmp_path / "drain.control")
    control.create(path)
    service.attempt(path)
    service.workers_started()
    try:
        request, _ = await node("a").request("preempted", 60)
        acked = f"agentd/job/drain/{request.id}/ack/b"
        async with asyncio.timeout(10):
            while await store.get(acked) is None:
                await asyncio.sleep(0.01)
        assert json.loads(await store.get(acked) or b"") == {"ranks": 1, "steps": []}
    finally:
        await service.stop()
        await store.close()


class _LosesWaits(MemoryStore):
    """A store whose next wait fails, as the store's host lost at that moment; the other
    requests are served again (a client that failed over)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next_wait = True

    async def wait(self, keys, timeout):  # noqa: ASYNC109 (the store's own signature)
        if self.lose_next_wait:
            self.lose_next_wait = False
            raise StoreUnavailable("connection refused")
        return await super().wait(keys, timeout)


async def test_a_drain_whose_store_is_lost_while_it_waits_for_checkpoints_says_so(tmp_path, caplog):
    """The store was lost while the draining node waited for the checkpoints of step 8.
    The service set the step to -1 then: its log said every node had not confirmed
    "within 60s" (it had waited no time) and "checkpoints at step -1", and its outcome
    counted the drain as one whose nodes did not confirm. It now says the store was lost,
    and keeps the step chosen."""
    store = _LosesWaits()

    async def current_round() -> list[str]:
        return ["a", "b"]

    def node(name: str) -> Drains:
        return Drains(lambda: store, RunKeys("job"), name, current_round)

    left: list[tuple[str, int, bool]] = []
    outcomes: list[dict] = []
    service = DrainService(
        DrainSettings(),
        node("a"),
        dict,  # its workers are done: it reports no step and acknowledges at once
        lambda *leave: left.append(leave),
        lambda hook, doc=None: outcomes.append(doc) if hook == "drain_done" else None,
    )
    path = str(tmp_path / "drain.control")
    control.create(path)
    service.attempt(path)
    service.workers_started()
    other = node("b")
    caplog.set_level(logging.INFO, logger="agentd.drain.service")
    try:
        assert service.request("preempted", 138)
        async with asyncio.timeout(10):
            while (request := (await other.current())[0]) is None:
                await asyncio.sleep(0.01)
        await other.told(request.id, 1.0)
        await other.report_step(request.id, 7)
        async with asyncio.timeout(10):
            await service.finished()
    finally:
        await service.stop()
        await store.close()
    [(why, code, alone)] = left
    assert code == 138 and not alone
    assert "checkpoints at step 8" in why and "the store was lost" in why, why
    assert "did not confirm" not in caplog.text and "-1" not in why, caplog.text
    [outcome] = outcomes
    assert outcome["step"] == 8 and outcome["store_lost"] and outcome["missing"] == []
