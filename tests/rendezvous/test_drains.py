"""The drain's step agreement in a real (in-memory) store: the step is chosen only once
every member told its workers of the drain, so no member tells its ranks the step after
they passed it; and, once all are told, without waiting on ranks blocked in a collective."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentd.rendezvous.drains import DrainRequest, Drains
from agentd.rendezvous.keys import RunKeys
from agentd.store.memory import MemoryStore

QUICK = {"grace": 0.05, "settle": 0.02}


async def a_drain() -> tuple[Drains, Drains, DrainRequest]:
    """Nodes ``a`` (draining, its workers told) and ``b`` of one job, and a's request."""
    store = MemoryStore()

    async def members() -> list[str]:
        return ["a", "b"]

    leaving, other = (Drains(lambda: store, RunKeys("job"), n, members) for n in ("a", "b"))
    request, _ = await leaving.request("preempted", 60)
    await leaving.told(request.id, 0.25)
    return leaving, other, request


async def test_the_step_waits_for_a_member_that_learns_of_the_drain_late():
    leaving, late, request = await a_drain()
    await leaving.report_step(request.id, 19)
    choice = asyncio.ensure_future(leaving.choose_step(request.id, told_within=60, **QUICK))
    with pytest.raises(TimeoutError):  # the first report alone chose 20 before
        await asyncio.wait_for(asyncio.shield(choice), 1.0)
    await late.told(request.id, 0.25)  # its ranks pause at their next step from now on
    assert await choice == (20, [])
    assert await late.current() == (request, 20)


async def test_once_every_member_is_told_ranks_blocked_in_a_collective_are_not_waited_for():
    leaving, blocked, request = await a_drain()
    await blocked.told(request.id, 0.25)
    await leaving.report_step(request.id, 7)  # b's ranks wait in the all-reduce: no report
    assert await leaving.choose_step(request.id, told_within=60, **QUICK) == (8, [])


async def test_a_member_silent_for_the_window_is_named_and_left_out():
    leaving, _silent, request = await a_drain()
    await leaving.report_step(request.id, 4)
    assert await leaving.choose_step(request.id, told_within=0.2, **QUICK) == (5, ["b"])


async def test_no_worker_counting_steps_means_no_step_is_chosen():
    leaving, other, request = await a_drain()
    await other.told(request.id, 0.25)
    for node in (leaving, other):
        await node.report_step(request.id, -1)
    assert await leaving.choose_step(request.id, told_within=60, **QUICK) == (None, [])
    assert await other.current() == (request, None)


async def test_the_step_waits_as_long_as_a_member_said_its_workers_steps_take():
    """A member whose workers heartbeat reports at their next step, and says how long that
    may take; one with none to wait for reports at once (-1), which ends no wait. The
    choice waited 0.3 s in all before, and a step of a second was never reported."""
    leaving, other, request = await a_drain()
    await leaving.report_step(request.id, -1)
    await other.told(request.id, 2.0)
    choice = asyncio.ensure_future(leaving.choose_step(request.id, told_within=60, **QUICK))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(choice), 1.0)
    await other.report_step(request.id, 30)
    assert await choice == (31, [])


async def test_a_member_that_says_nothing_more_is_waited_for_as_long_as_it_said():
    leaving, other, request = await a_drain()
    await leaving.report_step(request.id, -1)
    await other.told(request.id, 0.5)  # and its agent dies
    began = time.monotonic()
    assert await leaving.choose_step(request.id, told_within=60, **QUICK) == (None, [])
    assert 0.5 <= time.monotonic() - began < 10


async def test_a_node_asked_to_drain_during_anothers_drain_joins_it():
    """A scheduler's warning reaches every node at once: the second request joins the
    first (it replaced it before, and its requester waited out the drain's timeout for
    acknowledgements of a drain no one followed)."""
    first, second, request = await a_drain()
    joined, was_joined = await second.request("time limit", 60)
    assert (joined, was_joined) == (request, True)
    assert await first.current() == (request, None)  # still the one every node follows
    assert await first.leaving(request.id) == {"a", "b"}
    await second.told(request.id, 0.25)
    await first.report_step(request.id, 9)
    waiting = asyncio.ensure_future(second.chosen_step(request.id, 10))
    assert await first.choose_step(request.id, told_within=60, **QUICK) == (10, [])
    assert await waiting == 10


async def test_a_node_that_joined_learns_at_once_that_no_step_was_chosen():
    """It waited for a step that never came (6 s before); it must not wait as long as a
    choice may take (the reports of long steps) once the choice is made."""
    first, second, request = await a_drain()
    await second.request("time limit", 60)
    await second.told(request.id, 0.25)
    for node in (first, second):
        await node.report_step(request.id, -1)
    waiting = asyncio.ensure_future(second.chosen_step(request.id, 30))
    assert await first.choose_step(request.id, told_within=60, **QUICK) == (None, [])
    assert await asyncio.wait_for(waiting, 5) is None
    assert await second.current() == (request, None)


async def test_a_request_left_standing_by_a_dead_agent_is_replaced_once_stale():
    dead, alive, request = await a_drain()
    replaced, joined = await alive.request("maintenance", 0.0)  # older than 0 s: stale
    assert not joined and replaced.id != request.id and replaced.node == "b"
    assert (await dead.current())[0] == replaced
    assert await alive.leaving(replaced.id) == {"b"}


async def test_a_request_by_a_node_gone_from_the_round_is_replaced_at_once():
    """Its agent was killed during its drain, and the others re-formed without it: a new
    drain joined that dead one before (its step long passed, no acknowledgement coming)
    and waited out the drain's timeout."""
    store = MemoryStore()
    members = ["a", "b", "c"]

    async def current_round() -> list[str]:
        return members

    dead, alive = (Drains(lambda: store, RunKeys("job"), n, current_round) for n in ("a", "b"))
    request, _ = await dead.request("preempted", 60)
    members = ["b", "c"]  # re-formed without a
    replaced, joined = await alive.request("maintenance", 60)
    assert not joined and replaced.id != request.id
