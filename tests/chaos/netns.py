"""Test hosts in network namespaces, on a bridge this test creates (iproute2, root only).

The bridge lives in the root namespace with the first address of its subnet; each host is
a namespace joined to it by a veth pair. :meth:`Bridge.cut` disables a host's bridge port:
its packets are dropped silently, as by a failed switch port (the link stays up, so
nothing tells either side). :meth:`Bridge.heal` forwards them again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


SUBNETS = range(20, 220)
"""The third byte of the 10.234.x.0/24 subnets a bridge may take."""


def _claim_subnet() -> tuple[int, int]:
    """A subnet no other test process holds (tests may run in parallel), and the open
    file whose lock holds it: the lock goes with the process, so none is ever stale."""
    for subnet in SUBNETS:
        fd = os.open(
            os.path.join(tempfile.gettempdir(), f"agentd-test-subnet-{subnet}.lock"),
            os.O_CREAT | os.O_RDWR,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return subnet, fd
    raise RuntimeError(f"every test subnet 10.234.{SUBNETS[0]}-{SUBNETS[-1]}.0/24 is taken")


class Bridge:
    """A bridge and its hosts; names carry this test process's pid so runs never collide,
    and its subnet is held under a lock while it lives."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.name = f"agbr{self.tag}"
        subnet, self._lock = _claim_subnet()
        self.subnet = f"10.234.{subnet}"
        self.address = f"{self.subnet}.1"
        self.hosts: dict[str, tuple[str, str]] = {}
        """host name -> (namespace, bridge-side interface)"""
        self.interfaces: dict[str, str] = {}
        """host name -> its interface inside its namespace (what ``GLOO_SOCKET_IFNAME`` names)"""
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.address}/24", "dev", self.name)
        ip("link", "set", self.name, "up")

    def add_host(self, host: str) -> str:
        """A new namespace on the bridge; returns its address."""
        index = len(self.hosts) + 11
        namespace = f"agns{self.tag}-{host}"
        outer, inner = f"agv{self.tag}{index}", f"agi{self.tag}{index}"
        address = f"{self.subnet}.{index}"
        ip("netns", "add", namespace)
        self.hosts[host] = (namespace, outer)
        self.interfaces[host] = inner
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", namespace)
        ip("link", "set", outer, "master", self.name)
        ip("link", "set", outer, "up")
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
        ip("-n", namespace, "link", "set", inner, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        return address

    def run_in(self, host: str) -> list[str]:
        """The argv prefix that runs a command on ``host``."""
        return ["ip", "netns", "exec", self.hosts[host][0]]

    def cut(self, host: str) -> None:
        subprocess.run(
            ["bridge", "link", "set", "dev", self.hosts[host][1], "state", "0"],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def heal(self, host: str) -> None:
        subprocess.run(
            ["bridge", "link", "set", "dev", self.hosts[host][1], "state", "3"],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def close(self) -> None:
        for namespace, outer in self.hosts.values():
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", outer)
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", namespace)
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", self.name)
        os.close(self._lock)
