"""The protocol simulation: agentd's real rendezvous, membership, release and store code
for N agents, their guardians and the store, in one process on a virtual clock
(:mod:`tests.sim.clock`), under a seeded schedule of faults, with the invariants of
docs/protocol.md checked as the events happen.

What is real: :class:`~agentd.rendezvous.dynamic.DynamicRendezvous` (rounds, sealing,
accounting, leases, the round watch, roll calls, leaving),
:func:`~agentd.rendezvous.release.release` (a guardian carrying out a will) and
:class:`~agentd.store.memory.MemoryStore` (the embedded store's core, TTLs on its serving
clock). What is modelled, and how:

- **the network** (:class:`Link`): every request and answer takes a seeded latency, so
  requests reorder. A partitioned agent's requests fail after
  :data:`~agentd.store.sockets.LIVENESS` seconds (TCP keepalive) and are retried for
  ``RETRY_TIMEOUT`` (the HTTP client's), a heartbeat once; a request under way when the
  partition starts loses its answer the same way. A request to a frozen store is delivered
  and waits, as on a live connection.
- **the workers**: one per agent, holding the global rank the round gave it, from the
  round's completion until the agent stops them (at once) or they die.
- **the guardian** (:class:`SimAgent`): a process of its own; when its agent dies it kills
  the workers and carries out the will; while its agent lives, it kills the workers
  ``LEASE_SLACK`` after the last lease it was told ends.
- **a guardian's death** (``kill_guardian``, drawn only when asked for): its twin
  (:func:`~agentd.hygiene.guardian_process.start_twin`) stands in at once, fencing the
  lease and carrying out the will, until the agent, while it runs, starts another
  :data:`GUARDIAN_START` later, which learns the lease and the will again; a twin
  standing in forks a twin of its own, which stands in should it die too;
- **a restart** (``restart``, drawn only when asked for): SIGKILL, and ``duration``
  seconds later a new node started with the same command line, as Kubernetes restarts a
  pod: on a host of its own (a pod's new address), but the store's host comes back at
  the endpoint and serves the seed again, empty, under term 1;
- **a worker that succeeds** (``finish``, drawn only when asked for): the agent stops
  watching its round and waits in the exit barrier (the real one); once it passes, or
  the run is closed, the agent closes the run as succeeded and exits, as ``agentd run``
  does. Half the time the same agent meets another fault within 5 s, in its barrier;
- **SIGSTOP** pauses everything the agent runs (:class:`~tests.sim.clock.Owner`), not its
  guardian or workers; **SIGKILL** stops it for good; a **lost host** takes agent,
  guardian and workers; **SIGTERM** stops the workers and leaves, as ``agentd run`` does.
- **the store** can freeze (nothing it runs moves, TTLs included: they run on its serving
  clock) and restart empty (requests under way are retried on the new one, as a reset
  connection is). With ``failover`` (:mod:`tests.sim.failover`) it is served by agent 0
  instead, the others standing by, and every client is agentd's ``FailoverStore``.

The invariants (docs/protocol.md), checked at the event that could break them:

- S1 when workers start: no live worker of another agent holds one of their ranks;
- S2 when a round is sealed: every member's heartbeat is live in the store;
- S3 at the end, from when rounds started: the others of a member that left alone
  (SIGTERM, SIGKILL with its guardian alive: within 3 s; a host lost whole: one lease +
  2 s), if still at least MIN, were in a later round by then;
- S5 at the end: every live agent is in one round with all of them, within a bound after
  the last fault (but those whose worker succeeded, which wait in their exit barrier; and
  where the round goes on beside them, a spare waits for its end); and none waits in its
  exit barrier where no agent is left at work (the barrier has no timeout here);
- S6 when a lease moves: it ends no later than one TTL after the last heartbeat sent that
  reached the store;
- S7 at the end, from what happened: an agent whose worker succeeded and which then left,
  died, froze or was cut off alone ended no round: the other members of its round that
  were at work kept their workers for its lease + 2 s (with ``failover``, one still
  serving the store then is excepted unless SIGTERMed: it had no member at work to hand
  the store down to, docs/protocol.md's known gap; a restart is excepted too: the new
  node it brings is a membership change).
- S8 when workers start: where a round the store still holds was sealed without the agent
  after the last round its workers ran in, its rendezvous said so (``sat_out()``), and it
  said so nowhere else (its first workers aside: a new node keeps none).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from agentd.hygiene.guardian_process import LEASE_SLACK
from agentd.rendezvous.api import RendezvousError
from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.dynamic import DynamicRendezvous
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.release import release
from agentd.rendezvous.sealing import ENDED
from agentd.rendezvous.summary import decode
from agentd.store import amnesia
from agentd.store.api import StoreError, StoreOutcomeUnknown, StoreUnavailable, WatchResult
from agentd.store.connect import OpenedStore
from agentd.store.memory import MemoryStore
from agentd.store.sockets import LIVENESS
from tests.sim import failover
from tests.sim.clock import START, Owner, Stuck, VirtualLoop, answer_lost, spawn

RUN_ID = "sim"
RETRY_TIMEOUT = 30.0
"""How long the HTTP client retries a request the network failed."""
SETTLE = 120.0
"""Seconds simulated after the last fault before liveness (S5) is judged."""
LEAVE_BOUND = 3.0
"""S3: what a node that leaves (SIGTERM, SIGKILL with its guardian alive) may cost the
others, in seconds, with the defaults; a host lost whole may cost one lease + 2 s."""
HOST_LOST_SLACK = 2.0
"""S3: a host lost whole may cost one lease and this many seconds."""
QUIET_BEFORE = 2.0
"""S3 is judged for a leave alone: no other fault between its bound and this long before
it, nor one earlier whose effects may last until then (its duration and a lease + 2 s)."""


class Violation(AssertionError):
    """An invariant of docs/protocol.md did not hold."""


# -- the schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """At ``at`` seconds, ``kind`` happens to agent ``target`` (or the store) for
    ``duration`` seconds."""

    at: float
    kind: str
    target: int = -1
    duration: float = 0.0

    def __str__(self) -> str:
        who = "store" if self.target < 0 else f"agent {self.target}"
        lasting = f" for {self.duration:.2f}s" if self.duration else ""
        return f"t={self.at:7.2f}s {self.kind:<13} {who}{lasting}"


AGENT_FAULTS = ("kill", "lose_host", "term", "stop", "partition")
STORE_FAULTS = ("freeze_store", "restart_store")
KINDS = (*AGENT_FAULTS, *STORE_FAULTS, "join")
"""The kinds a seed draws from by default (the seeds pinned in the tests were drawn so)."""
MORE_KINDS = ("kill_guardian", "restart", "finish")
"""Kinds drawn only when asked for (``--kinds``): adding one to :data:`KINDS` would draw
every seed's schedule anew."""
AFTER_FINISH = ("term", "kill", "lose_host", "stop", "partition")
"""What may happen to an agent in its exit barrier, within 5 s of its worker's success."""
GUARDIAN_START = 0.1
"""Seconds from a guardian's death to the new one the agent starts (it sees the exit on
its loop, then starts a bare interpreter)."""


@dataclass(frozen=True)
class Schedule:
    """One simulated job: ``nodes`` agents start at 0 (``min_nodes``:``max_nodes``), and
    ``faults`` happen to them."""

    seed: int
    nodes: int
    min_nodes: int
    max_nodes: int
    faults: tuple[Fault, ...]
    failover: bool = False
    """Agent 0 serves the store, the others stand by (:mod:`tests.sim.failover`); else
    the store is a process of its own."""

    def describe(self) -> str:
        head = (
            f"seed {self.seed}: {self.nodes} agents, nnodes {self.min_nodes}:{self.max_nodes}, "
            f"{len(self.faults)} fault(s)"
        )
        if self.failover:
            head += ", the store served by agent 0, the others standing by"
        return "\n".join([head, *(f"  {fault}" for fault in self.faults)])

    def without(self, index: int) -> Schedule:
        faults = self.faults[:index] + self.faults[index + 1 :]
        return dataclasses.replace(self, faults=faults)


def schedule_for(seed: int, kinds: tuple[str, ...] = KINDS, failover: bool = False) -> Schedule:
    """A random job and fault schedule, the same for the same ``seed``. ``failover``: the
    store is served by agent 0, the others stand by, and half the faults that strike an
    agent strike the store's host (store faults are not drawn: its host's are those)."""
    if failover:
        kinds = tuple(kind for kind in kinds if kind not in STORE_FAULTS)
        rng = random.Random(f"failover {seed}")
    else:
        rng = random.Random(seed)
    nodes = rng.randint(2, 5)
    min_nodes = rng.randint(1, nodes)
    max_nodes = rng.choice((nodes, nodes + 1))
    faults = []
    at = 0.0
    joined = nodes
    for _ in range(rng.randint(1, 4)):
        at += rng.choice((0.0, rng.uniform(0, 3), rng.uniform(0, 40)))
        kind = rng.choice(kinds)
        if kind == "join":
            faults.append(Fault(round(at, 3), kind, joined))
            joined += 1
        elif kind == "restart":
            target = 0 if failover and rng.random() < 0.5 else rng.randrange(joined)
            delay = rng.choice((0.0, rng.uniform(0, 5), rng.uniform(0, 30)))
            faults.append(Fault(round(at, 3), kind, target, round(delay, 3)))
            joined += 1
        elif kind in STORE_FAULTS:
            faults.append(Fault(round(at, 3), kind, -1, round(rng.uniform(0.5, 20), 3)))
        elif kind == "finish":
            target = 0 if failover and rng.random() < 0.5 else rng.randrange(joined)
            faults.append(Fault(round(at, 3), kind, target))
            if rng.random() < 0.5:  # in its exit barrier
                then = rng.choice(AFTER_FINISH)
                duration = round(rng.uniform(0.5, 25), 3) if then in ("stop", "partition") else 0
                faults.append(Fault(round(at + rng.uniform(0, 5), 3), then, target, duration))
        else:
            duration = round(rng.uniform(0.5, 25), 3) if kind in ("stop", "partition") else 0
            target = 0 if failover and rng.random() < 0.5 else rng.randrange(joined)
            faults.append(Fault(round(at, 3), kind, target, duration))
    faults.sort(key=lambda fault: fault.at)  # (stable: the other kinds come in order)
    return Schedule(seed, nodes, min_nodes, max_nodes, tuple(faults), failover)


def closing_schedule_for(seed: int) -> Schedule:
    """A job that ends (S9): more nodes than ``MAX`` (spares), every one's worker
    succeeding between 2 and 10 s (a spare's success is no fault: it has no worker), and
    up to two faults of :data:`KINDS` among them; half the seeds with ``failover``. A
    drawn schedule closes its run about once in 300 seeds; this one almost always does."""
    rng = random.Random(f"closing {seed}")
    failover = rng.random() < 0.5
    nodes = rng.randint(2, 5)
    max_nodes = rng.randint(1, nodes - 1)
    min_nodes = rng.randint(1, max_nodes)
    faults = [Fault(round(rng.uniform(2, 10), 3), "finish", i) for i in range(nodes)]
    joined = nodes
    kinds = [kind for kind in KINDS if not (failover and kind in STORE_FAULTS)]
    for _ in range(rng.randint(0, 2)):
        kind, at = rng.choice(kinds), round(rng.uniform(0, 15), 3)
        if kind == "join":  # and its worker succeeds too
            faults.append(Fault(at, kind, joined))
            faults.append(Fault(round(at + rng.uniform(0, 5), 3), "finish", joined))
            joined += 1
        elif kind in STORE_FAULTS:
            faults.append(Fault(at, kind, -1, round(rng.uniform(0.5, 20), 3)))
        else:
            duration = round(rng.uniform(0.5, 25), 3) if kind in ("stop", "partition") else 0
            faults.append(Fault(at, kind, rng.randrange(joined), duration))
    faults.sort(key=lambda fault: fault.at)
    return Schedule(seed, nodes, min_nodes, max_nodes, tuple(faults), failover)


# -- the store and the network ---------------------------------------------------------------


class StoreHost:
    """The store's process: a :class:`MemoryStore` on the virtual clock."""

    def __init__(self, loop: VirtualLoop, records: bool = False) -> None:
        self._loop = loop
        self.epoch = 0
        self.owner = Owner("store")
        self.store = MemoryStore(clock=loop.time)
        self.restarted = asyncio.Event()
        self._records = records
        self.alive: tuple[float, float] | None = None
        """The host's copy of ``agentd store``'s lease record (``amnesia.AliveRecord``):
        when a store last noted that it held TTL keys, and their longest TTL. Kept where
        the schedule restarts the store (``records``)."""
        if records:
            self._keep_record()

    def _keep_record(self) -> None:
        """As ``AliveRecord.keep``: noted as the first TTL key is written and every
        second after (so, as the server's, up to a second old at a crash), by the store's
        process (frozen with it, gone with it); dropped once it holds none."""
        store, kept = self.store, False

        def note() -> None:
            nonlocal kept
            if store.holds_ttl_keys:
                self.alive, kept = (self._loop.time(), store.longest_ttl), True
            elif kept:
                self.alive, kept = None, False

        async def keep() -> None:
            while True:
                note()
                await asyncio.sleep(amnesia.EVERY)

        store.on_first_ttl_key = note
        spawn(self.owner, keep(), "store-record")

    def freeze(self) -> None:
        self.owner.paused = True

    def thaw(self) -> None:
        self._loop.resume(self.owner)

    def restart(self) -> None:
        """A new, empty store: the old one's work in flight is lost with it. As
        ``agentd store`` started again on its port, it tells its clients how long ago its
        previous self last noted leases in its record (``agentd.store.amnesia``)."""
        self.owner.dead = True
        self.epoch += 1
        self.owner = Owner(f"store#{self.epoch}")
        self.store = MemoryStore(clock=self._loop.time)
        if self.alive is not None:
            forgot = amnesia.Forgot(self._loop.time() - self.alive[0], self.alive[1])
            if forgot.worth_telling:
                told = amnesia.tell(self.store, forgot, self._loop.time)
                spawn(self.owner, told, "store-word")
        if self._records:
            self._keep_record()
        self.restarted.set()
        self.restarted = asyncio.Event()

    def live(self, key: str) -> bool:
        return self.store._live(key) is not None


class Link:
    """One process's connection to the store, as the Store protocol (see the module
    docstring for what the network does to it)."""

    def __init__(self, world: World, node: SimAgent) -> None:
        self._world = world
        self._node = node
        self._epoch: int | None = None
        """The store (its restarts counted) that answered last."""
        self._base = 0
        """As the HTTP client's: added to the revisions of the store answering now."""
        self._highest = 0
        self.incarnation = 0
        """As the HTTP client's: how many times the store answering was replaced."""

    @property
    def instance(self) -> str | None:
        """As the HTTP client's: the store (its restarts counted) that answered last."""
        return None if self._epoch is None else str(self._epoch)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        once = name == "heartbeat"  # the HTTP client's refresh in one attempt
        if name.startswith("_") or not (once or hasattr(MemoryStore, name)):
            raise AttributeError(name)
        op = "refresh" if once else name

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._call(op, args, kwargs, once)

        return call

    async def close(self) -> None:
        pass

    async def _call(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], once: bool
    ) -> Any:
        """As the HTTP client does, revisions only grow across a store's restarts: the
        first answer of a new store moves the base past every revision handed out, and a
        watch from a revision before that, or under way as it moved, is ``compacted``."""
        if op != "watch":
            return self._rebased(op, await self._send(op, args, kwargs, once))
        prefix, after, timeout = args
        base = self._base
        if after < base:
            return WatchResult(await self.revision(), compacted=True)
        result = await self._send(op, (prefix, after - base, timeout), kwargs, once)
        if self._base != base:
            return WatchResult(await self.revision(), compacted=True)
        return self._rebased(op, result)

    def _rebased(self, op: str, result: Any) -> Any:
        def rev(revision: int) -> int:
            self._highest = max(self._highest, revision + self._base)
            return revision + self._base

        if op in ("set", "multi_set", "revision"):
            return rev(result)
        if op == "watch":
            events = tuple(e._replace(revision=rev(e.revision)) for e in result.events)
            return WatchResult(rev(result.revision), events, result.compacted)
        return result

    def _answered_by(self, host: StoreHost) -> None:
        if self._epoch is not None and host.epoch != self._epoch:
            self._base = self._highest + 1  # the client's rebase on a new instance
            self.incarnation += 1
        self._epoch = host.epoch

    async def _send(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], once: bool
    ) -> Any:
        world, node = self._world, self._node
        sent = world.loop.time()
        while True:
            world.requests += 1
            await asyncio.sleep(world.latency())
            if not node.partitioned:
                host = world.host
                if op in ("set", "refresh") and args and args[0] == node.heartbeat_key:
                    node.delivered = max(node.delivered, sent)
                task = spawn(host.owner, getattr(host.store, op)(*args, **kwargs), f"store {op}")
                # unless the caller reads it below; in no process's context: a dead store's too
                task.add_done_callback(answer_lost, context=contextvars.Context())
                cut = asyncio.ensure_future(node.cut.wait())
                reset = asyncio.ensure_future(host.restarted.wait())
                try:
                    await asyncio.wait({task, cut, reset}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    cut.cancel()
                    reset.cancel()
                if task.done():
                    result = task.result()  # the store's own errors are the caller's
                    world.after_op(host, op, args, result)
                    self._answered_by(host)
                    await asyncio.sleep(world.latency())
                    if not node.partitioned:
                        return result
                elif reset.done() and not once:
                    continue  # a reset connection: retried on the new store at once
            # the network failed this attempt: TCP notices within LIVENESS
            await asyncio.sleep(LIVENESS)
            if op == "add" and not once:
                raise StoreOutcomeUnknown(f"sim: {op} failed after it may have been applied")
            if once or world.loop.time() - sent >= RETRY_TIMEOUT:
                raise StoreUnavailable(f"sim: the store is unreachable ({op})")


# -- the agents ------------------------------------------------------------------------------


@dataclass
class Hold:
    """The worker of one agent: the global rank its round gave it."""

    generation: int
    rank: int


class HostDisk:
    """What a host keeps across its agent's restart: the store host's last round
    (``agentd.rendezvous.host_memory``)."""

    boot = "sim"

    def __init__(self) -> None:
        self.doc: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return self.doc

    def save(self, doc: dict[str, Any]) -> None:
        self.doc = dict(doc)

    def clear(self) -> None:
        self.doc = None


class SimAgent:
    """One agent with its guardian and its worker."""

    def __init__(self, world: World, index: int, host: int | None = None) -> None:
        self.world = world
        self.index = index
        self.host = index if host is None else host
        """Its host's number: its own, but a restarted store host's is the seed's (0)."""
        self.owner = Owner(f"agent{index}")
        self.guardian = Owner(f"guardian{index}")
        self.partitioned = False
        self.cut = asyncio.Event()
        self.down = asyncio.Event()
        """Set when its process is gone (killed, exited, its host lost)."""
        self.delivered = 0.0
        """The latest send time of a heartbeat (or announcement) that reached the store."""
        self.lease: float | None = None
        self.lease_moved = asyncio.Event()
        self.will: dict[str, Any] | None = None
        self.hold: Hold | None = None
        self.workers_died = asyncio.Event()
        self.succeeded = asyncio.Event()
        self.finished: int | None = None
        """The round its worker succeeded in (it waits in the exit barrier since)."""
        self.released_at: dict[int, float] = {}
        """When it stopped its workers of each round."""
        self.state = "running"
        self.exit = ""
        self.ended_at: float | None = None
        """When it stopped being alive (exited, killed, lost, left)."""
        self.rounds_at: dict[int, float] = {}
        """When its workers of each round started."""
        settings = RendezvousSettings(world.schedule.min_nodes, world.schedule.max_nodes)
        disk = world.disks.setdefault(self.host, HostDisk())
        with mock.patch("os.urandom", world.rng.randbytes):
            self.handler = DynamicRendezvous(RUN_ID, self._open, settings, keeper=disk)
        self.handler.node_id = f"node{index}"
        self.heartbeat_key = RunKeys(RUN_ID).heartbeat(self.handler.node_id)
        self.handler.on_lease(self._on_lease)
        self.handler.on_will(self._on_will)

    @property
    def alive(self) -> bool:
        return self.state in ("running", "stopped")

    async def _open(self) -> OpenedStore:
        if self.world.network is not None:
            return await failover.open_store(self.world.network, self)

        async def nothing() -> None:
            pass

        return OpenedStore(
            Link(self.world, self),  # type: ignore[arg-type]
            nothing,
            remote=True,
            single_process=True,
            where="the simulated store",
            client_spec=lambda: {"endpoints": ["sim"]},
        )

    def _on_lease(self, deadline: float | None) -> None:
        self.lease = deadline
        self.lease_moved.set()
        ttl = self.handler.settings.heartbeat_ttl
        if deadline is not None and deadline > self.delivered + ttl + 1e-9:
            self.world.violate(
                "S6",
                f"agent {self.index}'s lease runs to t={deadline - START:.3f}s, past one TTL "
                f"({ttl:g}s) after its last heartbeat that reached the store "
                f"(sent t={self.delivered - START:.3f}s)",
            )

    def _on_will(self, doc: dict[str, Any] | None) -> None:
        self.will = doc

    def start(self) -> None:
        self.task = spawn(self.owner, self._main(), f"agent{self.index}")
        spawn(self.guardian, self._fence(), f"guardian{self.index}")

    async def _main(self) -> None:
        try:
            while True:
                info = await self.handler.next_rendezvous()
                told = self.handler.sat_out()  # as the agent asks, to start or resume workers
                self.workers_died.clear()
                self.world.start_workers(
                    self, info.generation, info.group_rank, info.group_world_size, told
                )
                watch = asyncio.ensure_future(self.handler.round_over())
                died = asyncio.ensure_future(self.workers_died.wait())
                done = asyncio.ensure_future(self.succeeded.wait())
                try:
                    ready, _ = await asyncio.wait(
                        {watch, died, done}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for task in (watch, died, done):
                        task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RendezvousError):
                        await watch
                if done in ready and died not in ready:
                    await self._exit_barrier(info.generation)
                    return
                self.hold = None  # the agent stops its workers
                self.released_at.setdefault(info.generation, self.world.loop.time())
                self.world.note(f"agent {self.index}: stops its workers of round {info.generation}")
        except (RendezvousError, StoreError) as exc:  # agentd run exits with it
            self.hold = None
            self.state, self.exit = "exited", f"{type(exc).__name__}: {exc}"
            self.ended_at = self.world.loop.time()
            spawn(self.owner, self._exit(), f"exit{self.index}")
        except Exception as exc:  # a bug: agentd run would die with a traceback
            self.hold = None
            self.state, self.exit = "crashed", f"{type(exc).__name__}: {exc}"
            self.ended_at = self.world.loop.time()
            self.world.violate("crash", f"agent {self.index}'s rendezvous raised {self.exit}")

    async def _exit_barrier(self, generation: int) -> None:
        """Its worker succeeded in round ``generation``: the exit barrier, then the run
        closed as succeeded and the exit, as ``agentd run`` does."""
        self.hold = None
        self.finished = generation
        self.world.note(f"agent {self.index}: its worker succeeded; in the exit barrier")
        with contextlib.suppress(RendezvousError, StoreError):  # its workers succeeded
            await self.handler.exit_barrier()
        with contextlib.suppress(RendezvousError, StoreError):
            await self.handler.set_closed(True, "the workers succeeded")
            self.world.closed_at = min(self.world.closed_at, self.world.loop.time())
        self.state, self.exit = "exited", "succeeded"
        self.ended_at = self.world.loop.time()
        spawn(self.owner, self._exit(), f"exit{self.index}")

    async def _exit(self) -> None:
        """As ``agentd run`` ends on a rendezvous error: it leaves the rendezvous (its
        shutdown), then the process is gone, its heartbeat with it."""
        with contextlib.suppress(Exception):
            await self.handler.shutdown()
        self.owner.dead = True
        self.down.set()

    async def _fence(self) -> None:
        """The guardian's lease fence: the workers die ``LEASE_SLACK`` after the lease."""
        while True:
            self.lease_moved.clear()
            lease = self.lease
            if lease is None:
                await self.lease_moved.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(lease + LEASE_SLACK):
                    await self.lease_moved.wait()
                    continue
            if self.hold is not None:
                self.world.note(f"guardian {self.index} kills the workers at the lease's end")
                self.kill_workers()
            await self.lease_moved.wait()  # nothing to fence until the next lease

    def kill_workers(self) -> None:
        self.hold = None
        self.workers_died.set()

    # -- faults

    def sigkill(self) -> None:
        """The agent dies; its guardian kills the workers and carries out the will."""
        self.owner.dead = True
        self.down.set()
        self.state = "killed"
        self.ended_at = self.world.loop.time()
        self.hold = None
        if self.will is not None and not self.guardian.dead:  # a dead one carries out nothing
            spawn(self.guardian, self._release(self.will), f"release{self.index}")

    async def _release(self, will: dict[str, Any]) -> None:
        network = self.world.network
        if network is not None:
            await failover.carry_out(
                network, self, will, lambda said: self.world.note(f"guardian {self.index}: {said}")
            )
            return
        with contextlib.suppress(Exception):
            said = await release(will, Link(self.world, self))  # type: ignore[arg-type]
            self.world.note(f"guardian {self.index}: {said}")

    def kill_guardian(self) -> None:
        """The guardian (or a twin standing in) dies, and its twin stands in; the agent
        starts another guardian (once it runs again, if paused)."""
        self.guardian.dead = True
        self.world.note(f"{self.guardian.name}'s twin stands in")
        self._guard(f"twin{self.index}")
        spawn(self.owner, self._replace_guardian(), f"replace guardian{self.index}")

    async def _replace_guardian(self) -> None:
        await asyncio.sleep(GUARDIAN_START)
        if self.guardian.name.startswith("twin"):
            self.guardian.dead = True  # standing in, it stands aside
        self.world.note(f"agent {self.index} starts a new guardian")
        self._guard(f"guardian{self.index}")

    def _guard(self, name: str) -> None:
        self.guardian = Owner(name)
        self.lease_moved = asyncio.Event()  # the dead one's fence waits on the old one
        spawn(self.guardian, self._fence(), name)

    def lose_host(self) -> None:
        self.owner.dead = self.guardian.dead = True
        self.down.set()
        self.state = "lost"
        self.ended_at = self.world.loop.time()
        self.hold = None

    def sigterm(self) -> None:
        self.task.cancel()
        spawn(self.owner, self._leave(), f"leave{self.index}")

    async def _leave(self) -> None:
        with contextlib.suppress(Exception):  # as agentd run does, before its workers stop
            await self.handler.leaving_soon()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.hold = None
        with contextlib.suppress(Exception):
            await self.handler.shutdown()
        self.state = "left"
        self.ended_at = self.world.loop.time()


# -- the world ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    schedule: Schedule
    violations: list[str] = field(default_factory=list)
    requests: int = 0
    rounds: int = 0
    notes: list[str] = field(default_factory=list)


class World:
    def __init__(self, loop: VirtualLoop, schedule: Schedule) -> None:
        self.loop = loop
        self.schedule = schedule
        self.rng = random.Random(schedule.seed ^ 0x5EED)
        self.host = StoreHost(loop, any(f.kind == "restart_store" for f in schedule.faults))
        self.disks: dict[int, HostDisk] = {}
        self.network = failover.Network(self) if schedule.failover else None
        self.agents: list[SimAgent] = []
        self.requests = 0
        self.outcome = Outcome(schedule)
        self.leaves: list[tuple[Fault, int, int, float, list[SimAgent]]] = []
        """S3's cases: (the fault, who left, its round, the bound's time, the others)."""
        self.finished_leaves: list[tuple[Fault, int, int, float, list[SimAgent]]] = []
        """S7's cases, as S3's: a fault to an agent in its exit barrier."""
        self.full_at: dict[int, float] = {}
        """When the first worker of each round sealed with MAX members started."""
        self.closed_at = float("inf")
        """When an agent whose worker succeeded first closed the run (as succeeded)."""
        self.sealed: dict[int, set[str]] = {}
        """S8: the members of every round sealed, by generation."""

    def _remembered(self, generation: int) -> bool:
        """S8's premise: the store that serves now still holds round ``generation``'s seal,
        or the fence of a store that forgot it names it (one restarted empty, or a new
        server without it, forgot it: the known gap once the fence's lease is over; such a
        store may hold the round as ended since, moved past it)."""
        key = RunKeys(RUN_ID).round(generation, "sealed")
        store = self.host.store
        if self.network is not None:  # the newest term's server (an old one, frozen, may
            serving = [  # not have stepped down yet)
                s
                for s in self.network.servers.values()
                if s.candidacy is not None and s.candidacy.serving and s.agent.alive
            ]
            if not serving:
                return False
            store = max(serving, key=lambda s: s.candidacy.term).store  # type: ignore[union-attr]
        item, fence = store._live(key), store._live(RunKeys(RUN_ID).forgotten)
        if fence is not None and json.loads(fence.value)["generation"] == generation:
            return True  # the fence of a store that forgot the round names it
        return item is not None and item.value != ENDED

    def latency(self) -> float:
        r = self.rng.random()
        return 0.0002 + (self.rng.uniform(0, 0.2) if r < 0.02 else self.rng.uniform(0, 0.003))

    def note(self, line: str) -> None:
        self.outcome.notes.append(f"t={self.loop.time() - START:.3f}s {line}")

    def violate(self, invariant: str, detail: str) -> None:
        line = f"{invariant} at t={self.loop.time() - START:.3f}s: {detail}"
        self.outcome.violations.append(line)
        self.note(line)

    def start_workers(
        self, agent: SimAgent, generation: int, rank: int, size: int, told: bool = False
    ) -> None:
        """S1, and S8 (``told``: its rendezvous said a round was sealed without it)."""
        last = max(agent.rounds_at, default=None)
        missed = [
            g
            for g, members in self.sealed.items()
            if last is not None and last < g < generation and agent.handler.node_id not in members
        ]
        if missed and not told and any(self._remembered(g) for g in missed):
            self.violate(
                "S8",
                f"agent {agent.index} starts its workers of round {generation} (its last "
                f"round {last}) untold that round(s) {missed} were sealed without it: what "
                "its kept workers hold would pass for the job's latest state",
            )
        elif told and last is not None and not missed:
            self.violate(
                "S8",
                f"agent {agent.index} starts its workers of round {generation} told that a "
                f"round was sealed without it since its last, {last}, where none was: its "
                "kept workers would drop the job's latest state",
            )
        for other in self.agents:
            held = other.hold
            if other is not agent and held is not None and held.rank == rank:
                self.violate(
                    "S1",
                    f"rank {rank} of round {generation} starts on agent {agent.index} while "
                    f"agent {other.index}'s worker of round {held.generation} holds it",
                )
        agent.hold = Hold(generation, rank)
        agent.rounds_at.setdefault(generation, self.loop.time())
        if size == self.schedule.max_nodes:
            self.full_at.setdefault(generation, self.loop.time())
        self.note(f"agent {agent.index}: round {generation}, rank {rank} of {size}")

    def after_op(
        self, host: StoreHost | failover.SimServer, op: str, args: tuple[Any, ...], result: Any
    ) -> None:
        """S2: a round sealed with members only, each with a live heartbeat."""
        if op != "compare_set" or not args[0].endswith("/sealed") or not result[0]:
            return
        if args[2] == ENDED:
            return
        generation = int(args[0].rsplit("/", 2)[-2])
        size = decode(args[2]).size
        keys = RunKeys(RUN_ID)
        self.outcome.rounds += 1
        members = self.sealed.setdefault(generation, set())
        for i in range(size):
            item = host.store._live(keys.round(generation, f"node/{i}"))
            node = json.loads(item.value)["node"] if item else f"arrival {i}"
            members.add(node)
            if not host.live(keys.heartbeat(node)):
                self.violate(
                    "S2",
                    f"round {generation} sealed with {node} (rank {i}), whose heartbeat "
                    "the store no longer holds",
                )

    def fault(self, fault: Fault) -> None:
        self.note(f"fault: {fault}")
        if fault.kind == "join":
            self._add_agent()
            return
        if fault.kind == "freeze_store":
            self.host.freeze()
            self.loop.call_later(fault.duration, self.host.thaw)
            return
        if fault.kind == "restart_store":
            self.host.restart()
            return
        if fault.target >= len(self.agents):  # its join was shrunk away
            return
        agent = self.agents[fault.target]
        if not agent.alive:
            return
        if fault.kind == "finish":
            if agent.hold is not None and agent.finished is None:  # a worker at work
                agent.succeeded.set()
            return
        self._judge_leave(fault, agent)
        self._judge_finished_leave(fault, agent)
        if fault.kind == "kill":
            agent.sigkill()
        elif fault.kind == "lose_host":
            agent.lose_host()
        elif fault.kind == "kill_guardian":
            agent.kill_guardian()
        elif fault.kind == "restart":
            agent.sigkill()
            host = 0 if agent.host == 0 and self.network is not None else None
            self.loop.call_later(fault.duration, self._add_agent, host)
        elif fault.kind == "term":
            agent.sigterm()
        elif fault.kind == "stop":
            agent.owner.paused = True
            agent.state = "stopped"

            def cont() -> None:
                if agent.state == "stopped":
                    agent.state = "running"
                    self.loop.resume(agent.owner)

            self.loop.call_later(fault.duration, cont)
        elif fault.kind == "partition":
            agent.partitioned = True
            agent.cut.set()

            def heal() -> None:
                agent.partitioned = False
                agent.cut = asyncio.Event()

            self.loop.call_later(fault.duration, heal)

    def _judge_leave(self, fault: Fault, agent: SimAgent) -> None:
        """S3, for a member that leaves alone (no other fault near it): the others of its
        round, if still at least MIN, are in a later round within the bound."""
        ttl = agent.handler.settings.heartbeat_ttl
        bounds = {"term": LEAVE_BOUND, "kill": LEAVE_BOUND, "lose_host": ttl + HOST_LOST_SLACK}
        bounds["restart"] = LEAVE_BOUND  # a kill, its node back later
        if self.network is not None and self.network.serves(agent):
            bounds["lose_host"] = failover.store_host_lost_bound(agent.handler.settings)
        bound = bounds.get(fault.kind)
        if bound is None or agent.hold is None:
            return
        if self.closed_at <= self.loop.time():  # (seed 975, with every kind but failover)
            return  # a peer closed the run as succeeded: the others leave as they finish
        for other in self.schedule.faults:  # each other one's effects may last a lease
            lasts = other.at + other.duration + ttl + 2.0
            if other != fault and other.at <= fault.at + bound and lasts >= fault.at - QUIET_BEFORE:
                return
        generation = agent.hold.generation
        survivors = [
            a
            for a in self.agents
            if a is not agent and a.alive and a.hold is not None and a.hold.generation == generation
        ]
        lost = fault.kind == "lose_host"
        if lost and self.network is not None and not self.network.can_serve(survivors):
            return  # a job of two cannot tell its store host's loss from its own cut-off
        if len(survivors) >= self.schedule.min_nodes:
            deadline = self.loop.time() + bound
            self.leaves.append((fault, agent.index, generation, deadline, survivors))

    def _judge_finished_leave(self, fault: Fault, agent: SimAgent) -> None:
        """S7: a fault to an agent in its exit barrier, alone (no other fault but
        successes near it): the members of its round at work keep their workers, for
        ``close_timeout`` at least where it was the store's host, SIGTERMed."""
        generation = agent.finished
        if generation is None or fault.kind in ("kill_guardian", "restart"):
            return  # (a restart brings a new node, which the others re-form to admit)
        serves = self.network is not None and self.network.serves(agent)
        if serves and fault.kind != "term":
            return  # not handed down (none at work to take it): the store goes with it
        earlier = (f for f in self.schedule.faults if f.target == fault.target and f.at < fault.at)
        if serves and any(f.kind == "term" for f in earlier):
            return  # a second stop request: the host leaves at once, as asked (seed 374)
        ttl = agent.handler.settings.heartbeat_ttl
        # a store's host SIGTERMed keeps the store up for the others' workers (close_timeout)
        bound = agent.handler.settings.close_timeout if serves else fault.duration + ttl + 2.0
        for other in self.schedule.faults:
            lasts = other.at + other.duration + ttl + 2.0
            near = other.at <= fault.at + bound and lasts >= fault.at - QUIET_BEFORE
            if other != fault and other.kind != "finish" and near:
                return
        at_work = [
            a
            for a in self.agents
            if a is not agent and a.alive and a.hold is not None and a.hold.generation == generation
        ]
        deadline = self.loop.time() + bound
        self.finished_leaves.append((fault, agent.index, generation, deadline, at_work))

    def judge_finished_leaves(self) -> None:
        """S7, at the end, from what happened: no member at work stopped its workers of
        the round by the bound."""
        for fault, leaver, generation, deadline, at_work in self.finished_leaves:
            stopped = [
                a.index for a in at_work if a.released_at.get(generation, deadline + 1) <= deadline
            ]
            if stopped:
                self.violate(
                    "S7",
                    f"agents {stopped} stopped their workers of round {generation} after "
                    f"agent {leaver}, whose worker had succeeded, met {fault.kind} at "
                    f"t={fault.at:.3f}s",
                )

    def judge_leaves(self) -> None:
        """S3, at the end, from what happened (no timer of its own: the run is as without
        it): each survivor of a leave still alive at its bound was in a later round by
        then, or a later round had started with MAX members (spares that took places
        first leave a survivor waiting as a spare: the job's cost is that round's)."""
        for fault, leaver, generation, deadline, survivors in self.leaves:
            if any(g > generation and t <= deadline for g, t in self.full_at.items()):
                continue
            late = [
                a.index
                for a in survivors
                if (a.ended_at is None or a.ended_at > deadline)
                and not any(g > generation and t <= deadline for g, t in a.rounds_at.items())
            ]
            if late:
                self.violate(
                    "S3",
                    f"agents {late} were not in a round after round {generation} "
                    f"{deadline - START - fault.at:g}s after agent {leaver} left "
                    f"({fault.kind} at t={fault.at:.3f}s)",
                )

    def _add_agent(self, host: int | None = None) -> None:
        """A new node, on a host of its own (``host``: that host, where it comes back)."""
        agent = SimAgent(self, len(self.agents), host)
        self.agents.append(agent)
        agent.start()

    def _store_forgot_the_close(self) -> bool:
        """The store restarted empty once the run was closed: S9 is not judged (no agent
        can learn of the close then, docs/protocol.md)."""
        closed = self.closed_at - START
        return any(
            f.kind == "restart_store" and f.at + f.duration >= closed for f in self.schedule.faults
        )

    def _missed_the_close(self, agent: SimAgent) -> bool:
        """``agent`` was frozen or cut off at some time since the run was closed: the store
        that held the close may have gone meanwhile (its host waited for the agent until its
        lease lapsed); S9 does not judge it (it waits out its join timeout)."""
        closed = self.closed_at - START
        return any(
            f.kind in ("stop", "partition")
            and f.target == agent.index
            and f.at + f.duration >= closed
            for f in self.schedule.faults
        )

    def check_liveness(self) -> None:
        """S5: every live agent is in the same round, of all of them (up to MAX); and none
        waits in its exit barrier where no agent is left at work. S9: once the run is
        closed as succeeded, no live agent waits for a round."""
        live = [a for a in self.agents if a.alive and a.finished is None]
        waiting = [a.index for a in self.agents if a.alive and a.finished is not None]
        if waiting and not live:
            self.violate(
                "S5",
                f"{SETTLE:g}s after the last fault, agent(s) {waiting} still wait in their "
                "exit barrier, though no agent is left at work to finish the job",
            )
        if self.network is not None:  # waiting for a store it can never reach: not judged
            live = [a for a in live if not self.network.stranded(a)]
        idle = [a.index for a in live if a.hold is None and not self._missed_the_close(a)]
        if self.closed_at <= self.loop.time() and idle and not self._store_forgot_the_close():
            self.violate(
                "S9",
                f"{SETTLE:g}s after the last fault, agent(s) {idle} still wait for a round, "
                f"though the run was closed as succeeded at t={self.closed_at - START:.3f}s",
            )
        schedule = self.schedule
        if len(live) < schedule.min_nodes:
            return
        if self.network is not None and not self.network.can_serve(live):
            return
        holds = {a.index: a.hold for a in live}
        generations = {h.generation for h in holds.values() if h is not None}
        members = [i for i, h in holds.items() if h is not None]
        expected = min(len(live), schedule.max_nodes)
        finished = {a.finished for a in self.agents if a.finished is not None}
        if len(generations) == 1 and generations <= finished:
            return  # the round goes on beside members whose workers succeeded (S7): the
            # places they hold are not taken, so a spare waits for the round's end
        if len(generations) != 1 or len(members) != expected:
            self.violate(
                "S5",
                f"{SETTLE:g}s after the last fault, the live agents {sorted(holds)} are not "
                f"in one round of {expected}: "
                + ", ".join(
                    f"{i}: {'none' if h is None else f'round {h.generation}'}"
                    for i, h in sorted(holds.items())
                ),
            )
            return


async def _simulate(loop: VirtualLoop, schedule: Schedule) -> Outcome:
    world = World(loop, schedule)
    try:
        for _ in range(schedule.nodes):
            world._add_agent()
        quiet = START
        for fault in schedule.faults:
            await asyncio.sleep(max(0.0, START + fault.at - loop.time()))
            world.fault(fault)
            quiet = max(quiet, loop.time() + fault.duration)
        await asyncio.sleep(max(0.0, quiet + SETTLE - loop.time()))
        world.check_liveness()
        world.judge_leaves()
        world.judge_finished_leaves()
        world.outcome.requests = world.requests
        return world.outcome
    finally:  # also where the run was cut short (cancelled)
        for agent in world.agents:  # the master ports the rounds reserved, dead agents' too
            if agent.handler._rounds is not None:
                agent.handler._rounds.release()


def simulate(schedule: Schedule) -> Outcome:
    """Run ``schedule`` to its end; the same schedule gives the same outcome."""
    from tests.sim.clock import run

    logging.disable(logging.WARNING)  # the agents say what they see; the invariants judge
    entropy = random.Random(f"entropy {schedule.seed}")  # ids the code draws: seeded too
    jitter = random.Random(f"jitter {schedule.seed}")  # and the retries' backoff
    try:
        with (
            mock.patch("os.urandom", lambda n: entropy.randbytes(n)),
            mock.patch("agentd.store.retry.random", jitter),
        ):
            return run(lambda loop: _simulate(loop, schedule))
    except Stuck as exc:
        return Outcome(schedule, violations=[f"stuck: {exc}"])
    finally:
        logging.disable(logging.NOTSET)


def shrink(schedule: Schedule, fails: Callable[[Schedule], bool]) -> Schedule:
    """The schedule with the fewest faults that still ``fails``, one fault dropped at a time."""
    changed = True
    while changed:
        changed = False
        for index in range(len(schedule.faults)):
            smaller = schedule.without(index)
            if fails(smaller):
                schedule, changed = smaller, True
                break
    return schedule
