"""Where bench/bench_chaos.py's agents meet, and the faults that place adds.

- :class:`Loopback` (the default): ``c10d`` with two store candidates, 127.0.0.1 and
  127.0.0.2, served by the first two agents: the store fails over when its host is lost.
- :class:`LoopbackTls`: :class:`Loopback` over mutual TLS: the store candidates serve
  HTTPS, each agent presents a certificate of the job's CA (made by the openssl command
  in the run's folder), so every failover and every re-join makes new TLS connections.
- :class:`Etcd`: a 3-member etcd cluster on 127.0.0.1; ``etcd_member_kill`` SIGKILLs one
  member and starts it again on its data 2-6 s later.
- :class:`EtcdStalls`: :class:`Etcd`, and ``etcd_member_stall`` SIGSTOPs one member for
  2-8 s, then SIGCONT (it takes connections and answers nothing meanwhile).
- :class:`Namespaces` (root only): each agent in a network namespace of its own on a
  bridge (``tests/chaos/netns.py``), ``c10d`` with the first two agents' addresses as
  the store candidates, the workers' gloo on the namespace's interface; ``partition``
  cuts one agent's bridge port for 2-8 s (its packets are dropped silently, as by a failed
  switch port) and heals it.
- :class:`EtcdNamespaces` (root only): both faults at once, agents in network namespaces
  meeting through a 3-member etcd cluster on the bridge's address: a partition cuts an
  agent off from every member at once, and members are killed besides.
- :class:`EtcdNamespacesStalls` (root only): :class:`EtcdNamespaces` whose members also
  stall, as :class:`EtcdStalls`'.

Each place starts in its constructor and is torn down by :meth:`close`; :meth:`strike`
takes the faults of its own kinds, :meth:`tend` ends them when their time comes.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from run_control import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers, tests.chaos

Say = Callable[[str], None]


class Loopback:
    """``c10d`` on this host's loopback, with two store candidates."""

    name = "loopback"
    kinds: tuple[str, ...] = ()
    backend = "c10d"
    candidates = 2
    """How many agents serve a store candidate (started one at a time, in order)."""
    probed = True
    """Whether the bench can reach the agents' health endpoints (on this host's loopback)
    to probe them (bench/chaos_probes.py)."""

    def __init__(self, root: Path, agents: int) -> None:
        port = free_port()
        self.endpoints = f"127.0.0.1:{port},127.0.0.2:{port}"

    def prefix(self, index: int) -> list[str]:
        """What agent ``index``'s command line runs under."""
        return []

    def args(self, index: int) -> list[str]:
        """Agent ``index``'s own options."""
        return []

    def env(self, index: int) -> dict[str, str]:
        """Agent ``index``'s own environment (its workers inherit it)."""
        return {}

    def conf(self, index: int) -> str:
        """Agent ``index``'s own ``--rdzv-conf`` keys (comma-separated; "": none)."""
        return ""

    def strike(self, kind: str, target: int, now: float, rng: random.Random, say: Say) -> None:
        raise ValueError(f"{kind}: not a fault of {self.name}")

    def tend(self, now: float, say: Say) -> None:
        """End the faults whose time has come."""

    def close(self) -> None:
        """Tear the place down (after every agent is gone)."""


class LoopbackTls(Loopback):
    """:class:`Loopback`, the store served over mutual TLS: a CA made for the run, and a
    certificate and key for each agent."""

    name = "tls"

    def __init__(self, root: Path, agents: int) -> None:
        from tests.helpers.tls import make_ca, node_tls

        super().__init__(root, agents)
        ca = make_ca(root / "tls")
        self.tls = [node_tls(root / "tls", f"n{index}", ca) for index in range(agents)]

    def conf(self, index: int) -> str:
        return self.tls[index].conf()


class Etcd(Loopback):
    """A 3-member etcd cluster on 127.0.0.1 (on ``host``), whose members are killed and
    come back."""

    name = "etcd"
    kinds = ("etcd_member_kill",)
    backend = "etcd"
    candidates = 0
    members = 3

    def __init__(self, root: Path, agents: int, host: str = "127.0.0.1") -> None:
        from tests.helpers.etcd_server import EtcdCluster

        self.cluster = EtcdCluster(root / "etcd", size=self.members, host=host).start()
        self.endpoints = self.cluster.endpoints
        self.back_at: dict[int, float] = {}

    def strike(self, kind: str, target: int, now: float, rng: random.Random, say: Say) -> None:
        index = target % self.members
        self.cluster.kill(index)
        self.back_at[index] = now + rng.uniform(2.0, 6.0)
        say(f"SIGKILL to etcd member {index}")

    def tend(self, now: float, say: Say) -> None:
        for index, at in list(self.back_at.items()):
            if now >= at:  # in a thread: a member takes seconds to be healthy
                del self.back_at[index]
                threading.Thread(target=self._restart, args=(index, say), daemon=True).start()

    def _restart(self, index: int, say: Say) -> None:
        try:
            self.cluster.restart(index, timeout=30)
        except Exception as exc:  # the harness's problem: said; two members keep quorum
            say(f"etcd member {index} did not come back: {exc}")
        else:
            say(f"etcd member {index} started again")

    def close(self) -> None:
        self.cluster.stop()


class EtcdStalls(Etcd):
    """:class:`Etcd`, whose members also stall: ``etcd_member_stall`` SIGSTOPs one for 2-8 s
    (a disk that stalls, a paused VM: it takes connections and answers nothing), then
    SIGCONT."""

    name = "etcd-stalls"
    kinds = (*Etcd.kinds, "etcd_member_stall")

    def __init__(self, root: Path, agents: int, host: str = "127.0.0.1") -> None:
        super().__init__(root, agents, host)
        self.resume_at: dict[int, float] = {}

    def strike(self, kind: str, target: int, now: float, rng: random.Random, say: Say) -> None:
        if kind != "etcd_member_stall":
            super().strike(kind, target, now, rng, say)
            return
        index = target % self.members
        proc = self.cluster.members[index].proc
        if index in self.resume_at or proc is None or proc.poll() is not None:
            say(f"etcd member {index} is down or stalled already, nothing struck")
            return
        self.cluster.stall(index)
        self.resume_at[index] = now + rng.uniform(2.0, 8.0)
        say(f"SIGSTOP to etcd member {index}")

    def tend(self, now: float, say: Say) -> None:
        super().tend(now, say)
        for index, at in list(self.resume_at.items()):
            if now >= at:
                del self.resume_at[index]
                self.cluster.resume(index)
                say(f"etcd member {index} resumed")

    def close(self) -> None:
        for index in self.resume_at:  # a stopped member would not take its SIGTERM
            self.cluster.resume(index)
        super().close()


class Namespaces(Loopback):
    """Each agent in a network namespace on a bridge; ``partition`` cuts one off."""

    name = "namespaces"
    kinds = ("partition",)
    probed = False  # each endpoint is on its own namespace's loopback

    def __init__(self, root: Path, agents: int) -> None:
        from tests.chaos.netns import Bridge

        self.bridge = Bridge()
        try:
            self.addresses = [self.bridge.add_host(f"h{i}") for i in range(agents)]
        except BaseException:
            self.bridge.close()
            raise
        port = free_port()
        self.endpoints = ",".join(f"{a}:{port}" for a in self.addresses[: self.candidates])
        self.heal_at: dict[int, float] = {}

    def prefix(self, index: int) -> list[str]:
        return self.bridge.run_in(f"h{index}")

    def args(self, index: int) -> list[str]:
        return ["--local-addr", self.addresses[index]]

    def env(self, index: int) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": self.bridge.interfaces[f"h{index}"]}

    def strike(self, kind: str, target: int, now: float, rng: random.Random, say: Say) -> None:
        if target in self.heal_at:
            say(f"agent {target} is cut off already, nothing struck")
            return
        self.bridge.cut(f"h{target}")
        self.heal_at[target] = now + rng.uniform(2.0, 8.0)
        say(f"agent {target}'s network cut")

    def tend(self, now: float, say: Say) -> None:
        for index, at in list(self.heal_at.items()):
            if now >= at:
                del self.heal_at[index]
                self.bridge.heal(f"h{index}")
                say(f"agent {index}'s network healed")

    def close(self) -> None:
        for index in list(self.heal_at):
            with contextlib.suppress(subprocess.CalledProcessError):
                self.bridge.heal(f"h{index}")
        self.bridge.close()


class EtcdNamespaces(Namespaces):
    """:class:`Namespaces` whose agents meet through an :class:`Etcd` cluster on the
    bridge's address: ``partition`` and ``etcd_member_kill`` both."""

    name = "etcd-namespaces"
    cluster: type[Etcd] = Etcd
    kinds = (*Namespaces.kinds, *cluster.kinds)
    backend = Etcd.backend
    candidates = Etcd.candidates

    def __init__(self, root: Path, agents: int) -> None:
        super().__init__(root, agents)
        try:
            self.etcd = self.cluster(root, agents, host=self.bridge.address)
        except BaseException:
            super().close()
            raise
        self.endpoints = self.etcd.endpoints

    def strike(self, kind: str, target: int, now: float, rng: random.Random, say: Say) -> None:
        if kind in self.cluster.kinds:
            self.etcd.strike(kind, target, now, rng, say)
        else:
            super().strike(kind, target, now, rng, say)

    def tend(self, now: float, say: Say) -> None:
        super().tend(now, say)
        self.etcd.tend(now, say)

    def close(self) -> None:
        self.etcd.close()
        super().close()


class EtcdNamespacesStalls(EtcdNamespaces):
    """:class:`EtcdNamespaces` whose members also stall (:class:`EtcdStalls`): a node cut
    off, a member killed, a member that takes connections and answers nothing."""

    name = "etcd-namespaces-stalls"
    cluster = EtcdStalls
    kinds = (*Namespaces.kinds, *cluster.kinds)


PLACES: dict[str, type[Loopback]] = {
    p.name: p
    for p in (
        Loopback,
        LoopbackTls,
        Etcd,
        EtcdStalls,
        Namespaces,
        EtcdNamespaces,
        EtcdNamespacesStalls,
    )
}
