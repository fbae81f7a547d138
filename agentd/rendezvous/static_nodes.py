"""The static rendezvous of several nodes: node rank 0's agent serves the job's store, and
the agents meet in it at every attempt.

As torchrun's static backend, the agent of ``--node-rank 0`` serves a TCPStore at
``--master-addr``/``--master-port`` for its whole life, and the workers meet in it too
(``TORCHELASTIC_USE_AGENT_STORE=True``). torch's workers do not tell their attempts apart
in that store (torch 2.13 expects a new store for every attempt), so here the attempts
are agreed: a node that restarts its workers says so in the store, which ends the
current round on every other node (:meth:`round_over`, watched, not polled); each agent
stops its workers and arrives at the next round; once all have arrived, node 0 clears
the workers' keys, and only then do any new workers start. So no worker ever meets
another attempt's keys or processes. (torchrun keeps one store for every attempt: a node
that restarts first can meet the last attempt's keys, and its restarts fail now and then.)

At the first round each agent claims its node rank, with its role and worker count, and
waits (``rdzv_conf`` ``timeout``, 600 s as torch's) until every rank of ``--nnodes`` is
claimed: nodes may run different ``--nproc-per-node``; a node given a rank another node
took is told so, and so are nodes given different ``--nnodes``. The nodes of a static job
never change: later rounds reuse the claims. A node that gives up closes the job for
all. When the workers have all succeeded the agents meet once more (the exit barrier), so
node 0 keeps the store up until every node's workers are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError, StartError
from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousTimeoutError,
    RoleInstanceInfo,
)
from agentd.rendezvous.static import StaticRendezvous

if TYPE_CHECKING:
    from agentd.tcpstore.client import TCPStoreClient
    from agentd.tcpstore.server import TCPStoreServer

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0
"""Seconds an agent waits for node 0's store and for every node's claim (torch's)."""
REPORT_EVERY = 30.0
"""Seconds between the lines that name the node ranks still awaited."""
_PREFIX = "/agentd/static/"
_FINISHED, _ALL_FINISHED = _PREFIX + "finished", _PREFIX + "all_finished"
_CLOSED = _PREFIX + "closed"


def node_key(rank: int) -> str:
    """The store key of node ``rank``'s claim."""
    return f"{_PREFIX}node/{rank}"


def round_key(generation: int, what: str) -> str:
    """The store key of round ``generation``'s ``what``: ``over`` (why it ended),
    ``arrived`` (how many agents came), ``all`` (every agent came) or ``go`` (node 0
    cleared the workers' keys: start)."""
    return f"{_PREFIX}round/{generation}/{what}"


class StaticNodesRendezvous(StaticRendezvous):
    """Node ``node_rank`` of ``nnodes`` (> 1), meeting at ``master_addr:master_port``
    (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        master_addr: str,
        master_port: int,
        *,
        node_rank: int,
        nnodes: int,
        role: str = "default",
        local_world_size: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(
            run_id,
            master_addr,
            master_port,
            node_rank=node_rank,
            nnodes=nnodes,
            role=role,
            local_world_size=local_world_size,
        )
        self._timeout = timeout
        self._server: TCPStoreServer | None = None
        self._client: TCPStoreClient | None = None
        self._infos: tuple[RoleInstanceInfo, ...] | None = None
        self._token = os.urandom(6).hex()  # tells this agent's claim from any other's
        self._finished = False  # its workers succeeded: at the exit barrier, or past it

    @property
    def use_agent_store(self) -> bool:
        return True

    def hosts_workers_store(self) -> bool:
        return True

    @property
    def master_port(self) -> int:
        """Where node 0's agent serves the job's store (and the workers meet)."""
        return int(self._master_port or 0)

    async def next_rendezvous(self) -> RendezvousInfo:
        if self._infos is None:
            self._infos = await self._meet()  # every rank claimed: all are at round 0
        else:
            await self._arrive(self._generation + 1)
        self._generation += 1
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=self._node_rank,
            group_world_size=self._nnodes,
            master_addr=self._master_addr,
            master_port=self.master_port,
            generation=self._generation,
            role_infos=self._infos,
        )

    async def round_over(self) -> str:
        """Once another node restarts its workers (RendezvousClosedError: it gave up)."""
        try:
            why = await self._first_of(round_key(self._generation, "over"), None)
        except (ConnectionError, OSError, TimeoutError) as exc:
            raise self._lost(exc) from None
        return (why or b"").decode() or "a node restarts its workers"

    async def end_round(self, reason: str) -> None:
        """Tell the other nodes at once (they stop their workers and meet at the next round)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._store().set(round_key(self._generation, "over"), reason.encode())

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        """A job that failed here fails everywhere: the other nodes stop waiting for this one."""
        if not succeeded and self._client is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await self._client.set(_CLOSED, reason.encode() or b"closed")

    async def exit_barrier(self) -> None:
        """Wait until every node's workers have succeeded (the agent bounds the wait)."""
        client = self._client
        if client is None:
            return
        self._finished = True
        try:
            if await client.add(_FINISHED, 1) >= self._nnodes:
                await client.set(_ALL_FINISHED, b"1")
            await client.wait([_ALL_FINISHED])
        except (ConnectionError, OSError) as exc:  # node 0 left: nobody is left to wait for
            log.info("Exit barrier: the job's store at %s is gone (%s)", self._where(), exc)

    async def shutdown(self) -> None:
        """Leave; an agent that leaves before the job ends (a signal, an error) ends it on
        every node, which would otherwise wait for this one at their next round."""
        client, self._client = self._client, None
        if client is not None:
            if not self._finished:
                with contextlib.suppress(ConnectionError, OSError):
                    reason = f"node rank {self._node_rank}'s agent left before the job ended"
                    await client.set(_CLOSED, reason.encode())
            await client.close()
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    # -- the rounds --------------------------------------------------------------------------

    async def _arrive(self, generation: int) -> None:
        """Meet every node at round ``generation`` (this one's workers are stopped)."""
        client = self._store()
        deadline = asyncio.get_running_loop().time() + self._timeout
        try:
            ended = round_key(generation - 1, "over")  # unless end_round said why already
            await client.compare_set(ended, b"", b"a node restarts its workers")
            if await client.add(round_key(generation, "arrived"), 1) >= self._nnodes:
                await client.set(round_key(generation, "all"), b"1")
            if self._node_rank == 0:
                await self._until(round_key(generation, "all"), deadline, generation)
                assert self._server is not None
                self._server.clear_except(_PREFIX)  # no worker of an earlier round is left
                await client.set(round_key(generation, "go"), b"1")
            await self._until(round_key(generation, "go"), deadline, generation)
        except (ConnectionError, OSError, TimeoutError) as exc:
            raise self._lost(exc) from None

    async def _until(self, key: str, deadline: float, generation: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            left = max(0.0, deadline - loop.time())
            if await self._first_of(key, min(left, REPORT_EVERY)) is not None:
                return
            if loop.time() >= deadline:
                raise RendezvousTimeoutError(
                    f"static rendezvous: not every node of --nnodes {self._nnodes} restarted "
                    f"its workers within {self._timeout:g}s (rdzv_conf timeout; round "
                    f"{generation})"
                )
            (arrived,) = await self._store().multi_get([round_key(generation, "arrived")])
            log.info(
                "[%s] Waiting for the other nodes to restart their workers: %s of %d at round %d",
                self._role,
                arrived.decode() or "0",
                self._nnodes,
                generation,
            )

    async def _first_of(self, key: str, seconds: float | None) -> bytes | None:
        """``key``'s value once it exists, or None when ``seconds`` pass first; the job's
        close, watched beside it, raises RendezvousClosedError. On connections of their
        own: a cancelled wait closes its connection, and never the agent's."""
        from agentd.tcpstore.client import TCPStoreClient

        port = self.master_port
        clients = [await TCPStoreClient.connect(self._master_addr, port, 10) for _ in "kc"]
        waits = [
            asyncio.ensure_future(clients[0].wait([key], seconds)),
            asyncio.ensure_future(clients[1].wait([_CLOSED], seconds)),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if waits[1].done() and waits[1].result():
                (reason,) = await clients[1].multi_get([_CLOSED])
                raise RendezvousClosedError(
                    f"static rendezvous: another node ended the job ({reason.decode()})"
                )
            if not waits[0].result():
                return None
            (value,) = await clients[0].multi_get([key])
            return value
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            for client in clients:
                await client.close()

    def _store(self) -> TCPStoreClient:
        if self._client is None:
            raise RendezvousConnectionError("static rendezvous: not connected to the store")
        return self._client

    def _lost(self, exc: BaseException) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"static rendezvous: lost the job's store at {self._where()} ({exc}): node "
            "rank 0's agent ended, and its log says why"
        )

    # -- the first round ---------------------------------------------------------------------

    async def _meet(self) -> tuple[RoleInstanceInfo, ...]:
        from agentd.tcpstore.client import TCPStoreClient

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        if self._node_rank == 0:
            await self._serve()
        connecting = asyncio.ensure_future(
            TCPStoreClient.connect(self._master_addr, self.master_port, self._timeout)
        )
        try:
            while not (await asyncio.wait({connecting}, timeout=REPORT_EVERY))[0]:
                log.info(
                    "[%s] Waiting for node rank 0's agent to serve the job's store at %s "
                    "(rdzv_conf timeout=%gs)",
                    self._role,
                    self._where(),
                    self._timeout,
                )
            client = connecting.result()
        except TimeoutError as exc:
            raise RendezvousTimeoutError(
                f"static rendezvous: {exc}; node rank 0's agent serves it at --master-addr "
                f"and --master-port (rdzv_conf timeout={self._timeout:g})"
            ) from None
        finally:
            connecting.cancel()
        self._client = client
        try:
            mine = self._claim()
            held = await client.compare_set(node_key(self._node_rank), b"", mine)
            if held != mine:
                raise ConfigError(self._taken(held))
            keys = [node_key(rank) for rank in range(self._nnodes)]
            await self._wait_for(keys, deadline)
            claims = [_parse(raw) for raw in await client.multi_get(keys)]
        except (ConnectionError, OSError) as exc:
            raise self._lost(exc) from None
        return self._role_infos(claims)

    async def _serve(self) -> None:
        from agentd.rendezvous.workers_store import store_server
        from agentd.support.net import is_local_address

        # torch's store listens on every interface; an address of this host is enough.
        host = self._master_addr if is_local_address(self._master_addr) else ""
        server = store_server(host, self.master_port, self._local_world_size)
        try:
            await server.start("--master-port")
        except StartError as exc:
            raise StartError(
                f"{exc}: node rank 0 serves the job's store there (is another agent of "
                "this job on this host also --node-rank 0?)"
            ) from None
        self._server = server
        log.info("[%s] Serving the job's store on %s", self._role, self._where())

    def _claim(self) -> bytes:
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "role": self._role,
                "local_world_size": self._local_world_size,
                "nnodes": self._nnodes,
                "token": self._token,
            },
            sort_keys=True,
        ).encode()

    def _taken(self, held: bytes) -> str:
        other = _parse(held)
        return (
            f"--node-rank: {self._node_rank!r} is taken by the agent on "
            f"{other.get('host', '?')} (pid {other.get('pid', '?')}): each node of a static "
            f"job needs its own --node-rank in 0..{self._nnodes - 1}"
        )

    async def _wait_for(self, keys: list[str], deadline: float) -> None:
        client = self._client
        assert client is not None
        loop = asyncio.get_running_loop()
        while not await client.wait(keys, max(0.0, min(deadline - loop.time(), REPORT_EVERY))):
            missing = [rank for rank, key in enumerate(keys) if not await client.check([key])]
            if loop.time() >= deadline:
                raise RendezvousTimeoutError(
                    f"static rendezvous: node rank(s) {missing} of --nnodes {self._nnodes} "
                    f"did not join at {self._where()} within {self._timeout:g}s "
                    "(rdzv_conf timeout)"
                )
            log.info(
                "[%s] Waiting for node rank(s) %s of --nnodes %d at %s",
                self._role,
                missing,
                self._nnodes,
                self._where(),
            )

    def _role_infos(self, claims: list[dict[str, object]]) -> tuple[RoleInstanceInfo, ...]:
        for rank, claim in enumerate(claims):
            if claim.get("nnodes") != self._nnodes:
                raise ConfigError(
                    f"--nnodes: {self._nnodes!r} here, but node rank {rank} (on "
                    f"{claim.get('host', '?')}) was given {claim.get('nnodes')!r}: every node "
                    "of a static job takes the same --nnodes"
                )
        return tuple(
            RoleInstanceInfo(str(claim["role"]), rank, int(str(claim["local_world_size"])))
            for rank, claim in enumerate(claims)
        )

    def _where(self) -> str:
        return f"{self._master_addr}:{self._master_port}"


def _parse(raw: bytes) -> dict[str, object]:
    """A node's claim (an unreadable one reads as empty, and then fails its checks)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
