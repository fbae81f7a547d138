"""A store's host stopped in its exit barrier keeps the store up for the others as it
leaves (``ExitBarrier._serve_the_others``): until they close the run, ``close_timeout`` at
most, or a second stop request. On the embedded store's core, as the host serves it (the
real processes: ``tests/integration/test_multinode.py``; the simulation's seed 382:
``tests/sim/test_failover.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
from agentd.store.connect import OpenedStore
from agentd.store.memory import MemoryStore
from tests.rendezvous.test_dynamic import FAST

LOG = "agentd.rendezvous.exit_barrier"


def node(store: MemoryStore, hosts: bool, close_timeout: float = 30.0) -> DynamicRendezvous:
    async def open_store() -> OpenedStore:
        async def nothing() -> None:
            pass

        async def hand_over(members: int) -> bool:
            return True  # to the next candidate, where every member stood by

        return OpenedStore(store, nothing, hosted=hosts, hand_over=hand_over)

    settings = RendezvousSettings(
        min_nodes=2, max_nodes=2, **{**FAST, "close_timeout": close_timeout}
    )
    return DynamicRendezvous("job", open_store, settings)


async def host_in_its_barrier(close_timeout: float = 30.0):
    """The host and its peer in one round; the host's workers succeeded and it is stopped
    in its barrier (the barrier cancelled, then the leave): (host, peer, the leave)."""
    store = MemoryStore()
    host, peer = node(store, True, close_timeout), node(store, False, close_timeout)
    await asyncio.gather(host.next_rendezvous(), peer.next_rendezvous())
    barrier = asyncio.create_task(host.exit_barrier())
    async with asyncio.timeout(10):
        while host._done_generation is None:
            await asyncio.sleep(0.01)
    barrier.cancel()  # SIGTERM: the agent stops waiting and leaves
    with contextlib.suppress(asyncio.CancelledError):
        await barrier
    return host, peer, asyncio.create_task(host.shutdown())


async def says(caplog: pytest.LogCaptureFixture, text: str) -> None:
    async with asyncio.timeout(10):
        while text not in caplog.text:
            await asyncio.sleep(0.01)


async def test_the_host_leaves_once_its_peer_has_finished_and_closed_the_run(caplog):
    with caplog.at_level(logging.INFO, logger=LOG):
        host, peer, leave = await host_in_its_barrier()
        await says(caplog, "keeps the store up until the other nodes' workers are done")
        await asyncio.sleep(0.3)  # a peer still at work: the host stays
        assert not leave.done()
        assert await peer.finished() == [host._round.rank]  # the round goes on for it
        await peer.exit_barrier()  # its workers are done too: the host's key is there
        await peer.set_closed(True, "the workers succeeded")
        await says(caplog, "this node leaves the store: the run was closed")
        await asyncio.wait_for(asyncio.gather(leave, peer.shutdown()), 10)  # the job is over


async def test_a_second_stop_request_leaves_at_once(caplog):
    with caplog.at_level(logging.INFO, logger=LOG):
        host, peer, leave = await host_in_its_barrier()
        await says(caplog, "keeps the store up")
        host.hurry()
        await asyncio.wait_for(leave, 10)
    assert "this node leaves the store: a second stop request" in caplog.text
    await peer.shutdown()


async def test_a_round_ended_meanwhile_ends_the_wait(caplog):
    """The peer's workers failed: it re-forms without the host, so keeping the store up
    saves it nothing (the generation is read every second)."""
    with caplog.at_level(logging.INFO, logger=LOG):
        _, peer, leave = await host_in_its_barrier()
        await says(caplog, "keeps the store up")
        await peer.end_round("its workers failed")
        await asyncio.wait_for(leave, 10)
    assert "this node leaves the store: round 0 ended" in caplog.text
    await peer.shutdown()


async def test_the_wait_ends_at_the_close_timeout(caplog):
    with caplog.at_level(logging.INFO, logger=LOG):
        _, peer, leave = await host_in_its_barrier(close_timeout=0.5)
        await asyncio.wait_for(leave, 10)
    assert "this node leaves the store: they did not finish within 0.5s" in caplog.text
    await peer.shutdown()


async def test_a_node_that_serves_no_store_leaves_at_once(caplog):
    store = MemoryStore()
    first, second = node(store, False), node(store, False)
    await asyncio.gather(first.next_rendezvous(), second.next_rendezvous())
    barrier = asyncio.create_task(first.exit_barrier())
    async with asyncio.timeout(10):
        while first._done_generation is None:
            await asyncio.sleep(0.01)
    barrier.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await barrier
    with caplog.at_level(logging.INFO, logger=LOG):
        await asyncio.wait_for(first.shutdown(), 10)
    assert "keeps the store up" not in caplog.text
    await second.shutdown()
