"""The node ranks of a static job of several nodes, and the agents' keys in node 0's
store (claims, beats, rounds) with the waits on them: each agent claims its
``--node-rank`` there, and keeps the claim alive with a beat.

A claim names its agent (host, pid, pid namespace, a random token), its role, worker
count and ``--nnodes``. A second agent given a rank that is claimed takes the claim over
only once its holder is surely gone: a process of this host and pid namespace that no
longer exists, or a beat that has not moved for :data:`JUDGE_AFTER` seconds. That is an
agent restarted after a SIGKILL, an out-of-memory kill or a reboot (systemd, a pod
restarted or made again), which under torchrun rejoins its job too; and at once, a claim
its agent gave back as it left (a signal). A holder that beats is another agent given
the same rank: a configuration error, told to the newcomer alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError
from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
    RoleInstanceInfo,
)

if TYPE_CHECKING:
    from agentd.tcpstore.client import TCPStoreClient

log = logging.getLogger(__name__)

PREFIX = "/agentd/static/"
"""The agents' keys in the job's store (node 0 never clears them between attempts)."""
BEAT_EVERY = 5.0
"""Seconds between a claim holder's beats."""
JUDGE_AFTER = 2.5 * BEAT_EVERY
"""Seconds a newcomer watches a claimed rank's beat before it counts the holder gone."""
REPORT_EVERY = 30.0
"""Seconds between the lines that name the node ranks still awaited."""


CLOSED = PREFIX + "closed"
"""Why the job was closed (a node failed for good)."""
CURRENT = PREFIX + "current"
"""The last round node 0 let start (none yet: round 0)."""


def round_key(generation: int, what: str) -> str:
    """The store key of round ``generation``'s ``what``: ``over`` (why it ended),
    ``here/<node rank>`` (that node's agent came) or ``go`` (node 0 cleared the workers'
    keys: start)."""
    return f"{PREFIX}round/{generation}/{what}"


def finished_key(rank: int) -> str:
    """The store key that says node ``rank``'s workers succeeded (the exit barrier)."""
    return f"{PREFIX}finished/{rank}"


def node_key(rank: int) -> str:
    """The store key of node ``rank``'s claim."""
    return f"{PREFIX}node/{rank}"


def beat_key(rank: int) -> str:
    """The store key of node ``rank``'s beat: a count its claim holder adds to."""
    return f"{PREFIX}beat/{rank}"


def claim(role: str, local_world_size: int, nnodes: int, token: str) -> bytes:
    """This agent's claim of a node rank."""
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pidns": _pid_namespace(),
            "role": role,
            "local_world_size": local_world_size,
            "nnodes": nnodes,
            "token": token,
        },
        sort_keys=True,
    ).encode()


def released(held: bytes) -> bytes:
    """A claim given back by its agent as it left: a newcomer takes it at once."""
    return json.dumps(dict(parse(held), left=True), sort_keys=True).encode()


def parse(raw: bytes) -> dict[str, object]:
    """A claim (an unreadable one reads as empty, and then fails its checks)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def taken(rank: int, held: bytes, nnodes: int) -> str:
    """Why ``rank`` cannot be ours: the live agent that holds it."""
    return (
        f"--node-rank: {rank!r} is taken by {who(held)}: each node of a static job needs its "
        f"own --node-rank in 0..{nnodes - 1}"
    )


def who(held: bytes) -> str:
    """The agent a claim names, for messages."""
    other = parse(held)
    return f"the agent on {other.get('host', '?')} (pid {other.get('pid', '?')})"


def role_infos(claims: list[dict[str, object]], nnodes: int) -> tuple[RoleInstanceInfo, ...]:
    """The nodes' roles and worker counts, by node rank, from their claims (ConfigError
    for a node given another ``--nnodes``)."""
    for rank, other in enumerate(claims):
        if other.get("nnodes") != nnodes:
            raise ConfigError(
                f"--nnodes: {nnodes!r} here, but node rank {rank} (on "
                f"{other.get('host', '?')}) was given {other.get('nnodes')!r}: every node "
                "of a static job takes the same --nnodes"
            )
    return tuple(
        RoleInstanceInfo(str(other["role"]), rank, int(str(other["local_world_size"])))
        for rank, other in enumerate(claims)
    )


def check_replacement(rank: int, held: bytes, mine: bytes) -> None:
    """A node that comes back runs what it ran: its peers placed its ranks by the first
    claim, and keep them (ConfigError naming the field that differs)."""
    old, new = parse(held), parse(mine)
    for field, flag in (("local_world_size", "--nproc-per-node"), ("role", "--role")):
        if old.get(field) != new.get(field):
            raise ConfigError(
                f"{flag}: {new.get(field)!r} here, but node rank {rank} ran with "
                f"{old.get(field)!r} before this agent took its place: a node of a static "
                "job that comes back keeps its worker count and role"
            )


async def take_rank(client: TCPStoreClient, rank: int, mine: bytes, nnodes: int) -> str:
    """Claim ``rank`` for ``mine``; where it was taken over from a gone agent, whose and
    why it counts as gone ('' for a rank nobody held; ConfigError where a live agent holds
    it)."""
    key = node_key(rank)
    held = await client.compare_set(key, b"", mine)
    if held == mine:
        return ""
    gone = await holder_gone(client, rank, held)
    if not gone:
        raise ConfigError(taken(rank, held, nnodes))
    check_replacement(rank, held, mine)
    if await client.compare_set(key, held, mine) != mine:  # another newcomer was first
        (held,) = await client.multi_get([key])
        raise ConfigError(taken(rank, held, nnodes))
    return f"{who(held)}: {gone}"


async def end_old_round(client: TCPStoreClient, rank: int, whose: str) -> int:
    """For an agent that took ``rank`` over (from ``whose``, and why): end the round its
    old self was in (or had run), which the others then leave, and return that round's
    generation. An old self whose workers had succeeded leaves nothing to run
    (RendezvousClosedError, as succeeded)."""
    done, current = await client.multi_get([finished_key(rank), CURRENT])
    if done:
        raise RendezvousClosedError(
            f"static rendezvous: node rank {rank}'s workers had succeeded before this agent "
            "took its place; nothing is left to run here",
            succeeded=True,
        )
    generation = int(current or b"0")
    why = f"node rank {rank}'s agent was replaced".encode()
    await client.compare_set(round_key(generation, "over"), b"", why)
    log.info(
        "Took node rank %d over from %s; meeting the other nodes at round %d",
        rank,
        whose,
        generation + 1,
    )
    return generation


async def first_of(
    host: str, port: int, keys: str | list[str], seconds: float | None
) -> bytes | None:
    """Once every key exists in the store at ``host:port``, the first one's value; None
    when ``seconds`` pass first; the job's close, watched beside it, raises
    RendezvousClosedError. On connections of their own: a cancelled wait closes its
    connection, and never the agent's."""
    from agentd.tcpstore.client import TCPStoreClient

    keys = [keys] if isinstance(keys, str) else keys
    clients: list[TCPStoreClient] = []
    waits: list[asyncio.Future[bool]] = []
    try:
        # The second connection is made just after the first reached the store: one
        # refused then means the store is gone, told at once (and the first one closed).
        for retry_for in (10.0, 1.0):
            clients.append(await TCPStoreClient.connect(host, port, retry_for))
        waits = [
            asyncio.ensure_future(clients[0].wait(keys, seconds)),
            asyncio.ensure_future(clients[1].wait([CLOSED], seconds)),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if waits[1].done() and waits[1].result():
            (reason,) = await clients[1].multi_get([CLOSED])
            raise RendezvousClosedError(
                f"static rendezvous: another node ended the job ({reason.decode()})"
            )
        if not waits[0].result():
            return None
        (value,) = await clients[0].multi_get(keys[:1])
        return value
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        for client in clients:
            await client.close()


async def wait_for_claims(
    client: TCPStoreClient, nnodes: int, deadline: float, where: str, allowed: float
) -> list[dict[str, object]]:
    """Every node rank's claim, once all are in (at ``deadline``, ``allowed`` seconds after
    the start, RendezvousTimeoutError naming the ranks missing; a line every
    :data:`REPORT_EVERY` seconds until then)."""
    keys = [node_key(rank) for rank in range(nnodes)]
    loop = asyncio.get_running_loop()
    while not await client.wait(keys, max(0.0, min(deadline - loop.time(), REPORT_EVERY))):
        missing = [rank for rank, key in enumerate(keys) if not await client.check([key])]
        if loop.time() >= deadline:
            raise RendezvousTimeoutError(
                f"static rendezvous: node rank(s) {missing} of --nnodes {nnodes} did not "
                f"join at {where} within {allowed:g}s (rdzv_conf timeout)"
            )
        log.info("Waiting for node rank(s) %s of --nnodes %d at %s", missing, nnodes, where)
    return [parse(raw) for raw in await client.multi_get(keys)]


async def holder_gone(client: TCPStoreClient, rank: int, held: bytes) -> str:
    """Why the agent whose claim of ``rank`` is ``held`` counts as gone ('' while it
    lives): at once for a dead process of this host, else once its beat stood still for
    :data:`JUDGE_AFTER`."""
    other = parse(held)
    if other.get("left"):
        return "it gave the rank back as it left"
    if _dead_here(other):
        return "its process has exited"
    log.info(
        "Node rank %d is claimed by the agent on %s (pid %s); watching its beat for %gs to "
        "tell whether it still runs",
        rank,
        other.get("host", "?"),
        other.get("pid", "?"),
        JUDGE_AFTER,
    )
    (before,) = await client.multi_get([beat_key(rank)])
    await asyncio.sleep(JUDGE_AFTER)
    (after,) = await client.multi_get([beat_key(rank)])
    return f"its beat stood still for {JUDGE_AFTER:g}s" if after == before else ""


async def beat(add: Callable[[str, int], Awaitable[int]], rank: int) -> None:
    """Keep ``rank``'s claim alive until cancelled, through ``add`` (a side connection
    that connects again after a failure: the agent's own may wait long, and a beat that
    stopped at a dropped connection would let a newcomer take a live agent's rank)."""
    while True:
        with contextlib.suppress(RendezvousConnectionError):
            await add(beat_key(rank), 1)
        await asyncio.sleep(BEAT_EVERY)


def _dead_here(other: dict[str, object]) -> bool:
    """Whether the claim's agent ran in this host's (and pid namespace's) process table,
    and has left it."""
    pid = other.get("pid")
    if other.get("host") != socket.gethostname() or other.get("pidns") != _pid_namespace():
        return False
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it lives
        pass
    return False


def _pid_namespace() -> int:
    """This process's pid namespace (0 where /proc cannot say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0
