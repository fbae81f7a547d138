"""The rendezvous of a job of one node: ``--standalone``, and ``static`` of one node."""

from __future__ import annotations

from agentd.rendezvous.api import agent_serves_store, fresh_store_each_attempt
from agentd.rendezvous.build import RendezvousRequest, build_rendezvous
from agentd.rendezvous.solo import SoloRendezvous


def test_a_static_job_of_one_node_serves_a_new_store_each_attempt_as_static():
    """torchrun's default command line: its agent serves the workers' store."""
    handler = build_rendezvous(RendezvousRequest(), "job", 4)
    assert isinstance(handler, SoloRendezvous) and handler.get_backend() == "static"
    assert handler.use_agent_store and fresh_store_each_attempt(handler, None)


def test_standalone_reports_agentd_as_its_backend():
    handler = build_rendezvous(RendezvousRequest(standalone=True), "job", 4)
    assert isinstance(handler, SoloRendezvous) and handler.get_backend() == "agentd"


def test_a_master_address_elsewhere_leaves_the_store_to_rank_0s_worker():
    request = RendezvousRequest(master_addr="10.255.0.1", master_port=42)
    handler = build_rendezvous(request, "job", 1)
    assert not agent_serves_store(handler, "10.255.0.1")
    assert not fresh_store_each_attempt(handler, "10.255.0.1")


async def test_each_round_reserves_a_new_port_for_its_store_unless_one_is_pinned():
    handler = build_rendezvous(RendezvousRequest(), "job", 2)
    first = await handler.next_rendezvous()
    assert (first.group_rank, first.group_world_size, first.master_addr) == (0, 1, "127.0.0.1")
    sock = handler.take_master_socket(first.master_port)  # type: ignore[attr-defined]
    assert sock is not None and sock.getsockname()[1] == first.master_port
    sock.close()
    await handler.shutdown()
    pinned = build_rendezvous(RendezvousRequest(master_port=29517), "job", 2)
    rounds = [await pinned.next_rendezvous() for _ in range(2)]
    assert [(r.master_port, r.generation) for r in rounds] == [(29517, 0), (29517, 1)]
    assert pinned.take_master_socket(29517) is None  # type: ignore[attr-defined]
    await pinned.shutdown()
