"""The drain's step agreement in a real (in-memory) store: the step is chosen only once
every member reported, so no member tells its ranks the step after they passed it."""

from __future__ import annotations

import asyncio

import pytest

from agentd.rendezvous.drains import Drains
from agentd.rendezvous.keys import RunKeys
from agentd.store.memory import MemoryStore


def drains_of(store: MemoryStore, *nodes: str) -> list[Drains]:
    async def members() -> list[str]:
        return list(nodes)

    return [Drains(lambda: store, RunKeys("job"), node, members) for node in nodes]


async def test_the_step_waits_for_a_member_that_learns_of_the_drain_late():
    store = MemoryStore()
    leaving, late = drains_of(store, "a", "b")
    request = await leaving.request("preempted")
    await leaving.report_step(request.id, 19)
    choice = asyncio.ensure_future(leaving.choose_step(request.id, window=60))
    with pytest.raises(TimeoutError):  # the first report alone chose 20 before
        await asyncio.wait_for(asyncio.shield(choice), 0.3)
    await late.report_step(request.id, 22)  # its ranks went on meanwhile
    assert await choice == (23, [])
    assert await late.current() == (request, 23)


async def test_a_member_silent_for_the_window_is_named_and_left_out():
    store = MemoryStore()
    leaving, _silent = drains_of(store, "a", "b")
    request = await leaving.request("preempted")
    await leaving.report_step(request.id, 4)
    assert await leaving.choose_step(request.id, window=0.2) == (5, ["b"])


async def test_no_worker_counting_steps_means_no_step_is_chosen():
    store = MemoryStore()
    leaving, other = drains_of(store, "a", "b")
    request = await leaving.request("preempted")
    await leaving.report_step(request.id, -1)
    await other.report_step(request.id, -1)
    assert await leaving.choose_step(request.id, window=60) == (None, [])
    assert await other.current() == (request, None)
