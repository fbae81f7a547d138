"""free_port(): ports that two tests, or two processes of one test, are never both given
while neither has bound them yet, and that nothing holds on any loopback address."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

import tests.conftest as conftest
from tests.conftest import free_port


@pytest.fixture
def as_worker(monkeypatch):
    """Run free_port() as pytest-xdist worker ``index`` of ``count``, nothing given yet."""

    def become(index: int, count: int) -> None:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
        monkeypatch.setattr(conftest, "_handed_out", set())

    return become


def test_each_worker_draws_from_its_own_share_of_the_ports(as_worker):
    as_worker(0, 2)
    first = {free_port() for _ in range(20)}
    as_worker(1, 2)
    second = {free_port() for _ in range(20)}
    assert {p % 2 for p in first} == {0} and {p % 2 for p in second} == {1}


def test_a_process_is_never_given_the_same_port_twice(as_worker):
    as_worker(0, 1)
    ports = [free_port() for _ in range(300)]  # none bound: each stays free
    assert len(set(ports)) == len(ports)


def test_a_port_held_on_another_loopback_address_is_not_given(as_worker):
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    share = list(range(20000, min(low, 32768))[7::3000])  # worker 7 of 3,000: 4 or 5 ports
    as_worker(7, 3000)
    with contextlib.ExitStack() as stack:
        for port in share[:-1]:  # as a store's candidate holds its endpoint's port
            holder = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # already held by something else: as good
                holder.bind(("127.0.0.2", port))
                holder.listen()
        try:
            port = free_port()
        except RuntimeError:
            pytest.skip(f"port {share[-1]} is in use on this machine")
        assert port == share[-1]
