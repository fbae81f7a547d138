"""Which agent serves a store at an address: the one whose --local-addr it is, else one on
the machine it names; two loopback addresses are two simulated hosts."""

from __future__ import annotations

from agentd.support.net import serves_here


def test_the_agent_named_by_the_endpoint_serves_it():
    assert serves_here("127.0.0.1", "127.0.0.1")
    assert serves_here("node01", "node01")  # by name, without resolving it


def test_another_loopback_address_is_another_simulated_host():
    assert not serves_here("127.0.0.1", "127.0.0.2")


def test_without_a_local_address_any_address_of_this_machine_serves():
    assert serves_here("127.0.0.1", None)
    assert serves_here("localhost", "127.0.0.2")  # a name: resolved, as before
    assert not serves_here("192.0.2.1", None)  # TEST-NET: never this machine
