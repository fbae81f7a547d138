"""DynamicRendezvous: elastic, generation-numbered rounds over any :class:`Store`.

The same code runs on the embedded store and on etcd. Keys, under ``agentd/<run_id>/``::

    ctl/gen             the current round (generation); any agent ends a round by moving it
                        on with compare_set, so stale agents never end a newer round
    ctl/closed          JSON {"outcome", "node", "reason"}: no more rounds
    ctl/hb/<node>       each agent's heartbeat, a TTL key refreshed without a change
    round/<g>/join      the arrival counter (add): an agent's arrival index is its group rank
    round/<g>/node/<i>  arrival i's JSON: node id, role, worker count, address, master port
    round/<g>/sealed    the member count n, set once: arrivals < n are the round's members
    round/<g>/done/<i>  member i's workers succeeded (the exit barrier)

A round is sealed by the arrival that makes it full (``max_nodes``), or, once ``min_nodes``
are in, by the first agent whose last-call timer runs out. Everyone else learns of the
seal through a watch on that one key, so completion takes one round trip after the last
join, and each agent does a fixed number of store operations per round. An arrival after
the seal waits for the next round; if the round has room it ends it at once (scale-up).
While the group runs, :meth:`round_over` watches ``ctl/``: a new generation (a failure or
a join elsewhere), a member's heartbeat vanishing (scale-down) or the rendezvous closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentd.exceptions import ConfigError, StartError
from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousInfo,
    RendezvousTimeoutError,
    RoleInstanceInfo,
)
from agentd.rendezvous.static import free_port
from agentd.store.api import Store, StoreError
from agentd.store.connect import OpenedStore, StoreOpener

log = logging.getLogger(__name__)

_POLL = 60.0
"""Longest single watch; the servers cap long polls at a minute."""
_FOREVER = 7 * 86400.0
_LEAVE_TIMEOUT = 2.0
"""Deleting our heartbeat is a courtesy (it expires anyway): never wait long for it."""


@dataclass(frozen=True)
class RendezvousSettings:
    """How a dynamic rendezvous waits (seconds); ``--rdzv-conf`` sets the timeouts."""

    min_nodes: int = 1
    max_nodes: int = 1
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3

    @property
    def heartbeat_ttl(self) -> float:
        """A heartbeat not refreshed for this long means its agent is gone."""
        return self.keep_alive_interval * self.keep_alive_max_attempt


@dataclass(frozen=True)
class _Round:
    """The round this agent is a member of."""

    generation: int
    rank: int
    size: int
    nodes: tuple[dict[str, Any], ...]
    revision: int
    """The store's revision when the round was read; :meth:`round_over` watches after it."""


class DynamicRendezvous:
    """An elastic rendezvous for ``run_id`` over a store opened by ``open_store``.

    ``open_store`` is called on the first rendezvous, in the agent's loop (see
    :mod:`agentd.store.connect`). ``role`` and
    ``local_world_size`` are what this agent contributes to rank assignment; ``addr`` is
    where its workers are reachable, used as MASTER_ADDR when it is group rank 0.
    """

    def __init__(
        self,
        run_id: str,
        open_store: StoreOpener,
        settings: RendezvousSettings,
        *,
        role: str = "default",
        local_world_size: int = 1,
        addr: str = "127.0.0.1",
        master_port: int | None = None,
        backend: str = "agentd",
    ) -> None:
        if not 1 <= settings.min_nodes <= settings.max_nodes:
            raise ConfigError(
                f"nnodes: {settings.min_nodes}:{settings.max_nodes} must have 1 <= MIN <= MAX"
            )
        self._run_id = run_id
        self._open_store = open_store
        self.settings = settings
        self._role = role
        self._local_world_size = local_world_size
        self._addr = addr
        self._master_port = master_port
        self._backend = backend
        self.node_id = f"{socket.gethostname()}_{os.getpid()}_{os.urandom(3).hex()}"
        self._prefix = f"agentd/{run_id}/"
        self._store: Store | None = None
        self._opened: OpenedStore | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._round: _Round | None = None
        self._ended: set[int] = set()
        self._closed = False
        self._observer: Callable[[str, float], None] | None = None

    def observe_store(self, observer: Callable[[str, float], None]) -> None:
        """Tell ``observer`` (operation, seconds) of every store request over the network."""
        self._observer = observer
        if self._store is not None and hasattr(self._store, "observer"):
            self._store.observer = observer

    # -- keys ----------------------------------------------------------------------------

    @property
    def _ctl(self) -> str:
        return self._prefix + "ctl/"

    @property
    def _gen_key(self) -> str:
        return self._ctl + "gen"

    @property
    def _closed_key(self) -> str:
        return self._ctl + "closed"

    def _hb_key(self, node: str) -> str:
        return f"{self._ctl}hb/{node}"

    def _round_key(self, generation: int, name: str) -> str:
        return f"{self._prefix}round/{generation}/{name}"

    # -- the handler protocol ---------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return False

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the rendezvous has not opened its store yet")
        return self._store

    async def next_rendezvous(self) -> RendezvousInfo:
        await self._open()
        self._round = None
        try:
            async with asyncio.timeout(self.settings.join_timeout):
                while True:
                    joined = await self._join_round()
                    if joined is not None:
                        break
        except TimeoutError:
            raise RendezvousTimeoutError(await self._timeout_message()) from None
        self._round = joined
        master = joined.nodes[0]
        return RendezvousInfo(
            run_id=self._run_id,
            group_rank=joined.rank,
            group_world_size=joined.size,
            master_addr=str(master["addr"]),
            master_port=int(master["port"]),
            generation=joined.generation,
            role_infos=tuple(
                RoleInstanceInfo(str(node["role"]), rank, int(node["nproc"]))
                for rank, node in enumerate(joined.nodes)
            ),
        )

    async def round_over(self) -> str:
        current = self._round
        if current is None:
            raise RuntimeError("round_over() needs a completed rendezvous")
        store = self.store
        members = {self._hb_key(str(node["node"])): str(node["node"]) for node in current.nodes}
        revision = current.revision
        check = True
        while True:
            if check:  # at the start, and whenever the store may have lost events
                revision = await store.revision()
                why = await self._round_state(current.generation, members)
                if why:
                    return why
                check = False
            result = await store.watch(self._ctl, revision, _POLL)
            if result.compacted:
                check = True
                continue
            revision = result.revision
            for event in result.events:
                if event.key == self._gen_key and event.value != str(current.generation).encode():
                    return f"generation {current.generation} ended"
                if event.key == self._closed_key and event.value is not None:
                    self._raise_if_failed(event.value)
                if event.key in members and event.value is None:
                    why = f"node {members[event.key]} left (no heartbeat)"
                    await self.end_round(why)
                    return why

    async def _round_state(self, generation: int, members: Mapping[str, str]) -> str:
        """Why round ``generation`` is over already ('' if it is not)."""
        keys = [self._gen_key, self._closed_key, *members]
        gen, closed, *beats = await self.store.multi_get(keys)
        if closed is not None:
            self._raise_if_failed(closed)
        if gen != str(generation).encode():
            return f"generation {generation} ended"
        for key, beat in zip(members, beats, strict=True):
            if beat is None:
                why = f"node {members[key]} left (no heartbeat)"
                await self.end_round(why)
                return why
        return ""

    async def end_round(self, reason: str) -> None:
        current = self._round
        if current is None or current.generation in self._ended:
            return
        self._ended.add(current.generation)
        await self._advance(current.generation, reason)

    async def num_nodes_waiting(self) -> int:
        current = self._round
        if current is None:
            return 0
        joined = await self.store.get(self._round_key(current.generation, "join"))
        return max(0, int(joined or 0) - current.size)

    async def exit_barrier(self) -> None:
        current = self._round
        if current is None:
            return
        store = self.store
        await store.set(self._round_key(current.generation, f"done/{current.rank}"), b"1")
        done = [self._round_key(current.generation, f"done/{i}") for i in range(current.size)]
        await store.wait(done, _FOREVER)

    async def set_closed(self, succeeded: bool, reason: str) -> None:
        if self._store is None or self._closed:
            return
        self._closed = True
        doc = {"outcome": "succeeded" if succeeded else "failed", "node": self.node_id,
               "reason": reason}  # fmt: skip
        await self._store.compare_set(self._closed_key, None, json.dumps(doc).encode())

    async def shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self._store is None or self._opened is None:
            return
        try:
            if not self._closed:  # the others re-form without us
                async with asyncio.timeout(self.settings.close_timeout):
                    await self.end_round(f"node {self.node_id} left")
            async with asyncio.timeout(_LEAVE_TIMEOUT):
                await self._store.delete(self._hb_key(self.node_id))
            if self._opened.hosted:
                await self._wait_for_peers_to_leave()
        except (StoreError, TimeoutError) as exc:
            log.warning("Rendezvous %s: could not leave cleanly: %s", self._run_id, exc)
        finally:
            await self._opened.close()
            self._store = self._opened = None

    async def _wait_for_peers_to_leave(self) -> None:
        """Keep the store we serve up until the round's other members are gone (their
        heartbeats deleted or expired), at most ``close_timeout`` seconds."""
        current = self._round
        if current is None:
            return
        store = self.store
        keys = [self._hb_key(str(node["node"])) for node in current.nodes]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.close_timeout):
                while True:
                    revision = await store.revision()
                    if all(beat is None for beat in await store.multi_get(keys)):
                        return
                    await store.watch(self._ctl + "hb/", revision, _POLL)

    # -- joining -----------------------------------------------------------------------------

    async def _open(self) -> None:
        if self._store is not None:
            return
        self._opened = await self._open_store()
        self._store = self._opened.store
        if self._observer is not None and hasattr(self._store, "observer"):
            self._store.observer = self._observer
        self._heartbeat = asyncio.create_task(self._keep_alive(), name="rdzv-heartbeat")

    def _beat_value(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()

    async def _keep_alive(self) -> None:
        key, ttl = self._hb_key(self.node_id), self.settings.heartbeat_ttl
        while True:
            await asyncio.sleep(self.settings.keep_alive_interval)
            try:
                if not await self.store.refresh(key, ttl):
                    log.warning("Rendezvous %s: our heartbeat had expired; renewed", self._run_id)
                    await self.store.set(key, self._beat_value(), ttl=ttl)
            except StoreError as exc:
                log.warning("Rendezvous %s: heartbeat failed: %s", self._run_id, exc)

    async def _generation(self) -> int:
        """The current generation (creating generation 0); raises if the run is closed."""
        store = self.store
        gen, closed = await store.multi_get([self._gen_key, self._closed_key])
        if closed is not None:
            raise self._closed_error(closed)
        if gen is None:
            _, gen = await store.compare_set(self._gen_key, None, b"0")
        return int(gen or 0)

    def _raise_if_failed(self, closed: bytes) -> None:
        """A peer failed for good: the job is over here too (a peer's success is not: our
        workers may still be running when it leaves the exit barrier)."""
        error = self._closed_error(closed)
        if not error.succeeded:
            self._closed = True  # nobody left to tell when we leave
            raise error

    def _closed_error(self, raw: bytes) -> RendezvousClosedError:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {}
        succeeded = doc.get("outcome") == "succeeded"
        what = "the job succeeded" if succeeded else f"node {doc.get('node', '?')} failed"
        reason = doc.get("reason", "")
        return RendezvousClosedError(
            f"rendezvous {self._run_id!r} is closed: {what}" + (f" ({reason})" if reason else ""),
            succeeded=succeeded,
        )

    async def _join_round(self) -> _Round | None:
        """Join the current round and wait for it to be sealed; None: try the next round."""
        store, settings = self.store, self.settings
        # (re)announce ourselves: a store that restarted has forgotten our heartbeat
        await store.set(self._hb_key(self.node_id), self._beat_value(), ttl=settings.heartbeat_ttl)
        generation = await self._generation()
        rank = await store.add(self._round_key(generation, "join"), 1) - 1
        if rank >= settings.max_nodes:
            log.info("Rendezvous %s: round %d is full; waiting for the next", self._run_id,
                     generation)  # fmt: skip
            await self._end_if_abandoned(generation, settings.max_nodes)
            await self._wait_for_generation_after(generation)
            return None
        node = {
            "node": self.node_id,
            "role": self._role,
            "nproc": self._local_world_size,
            "addr": self._addr,
            "port": self._master_port or self._pick_port(),
        }
        mine = json.dumps(node).encode()
        revision = await store.set(self._round_key(generation, f"node/{rank}"), mine)
        sealed_key = self._round_key(generation, "sealed")
        if rank + 1 == settings.max_nodes:
            await store.compare_set(sealed_key, None, str(settings.max_nodes).encode())
        loop = asyncio.get_running_loop()
        last_call = (
            loop.time() + settings.last_call_timeout if rank + 1 >= settings.min_nodes else None
        )
        sealed = await store.get(sealed_key)
        if sealed is None:
            log.info(
                "Rendezvous %s: joined round %d as node %d; waiting for %d..%d node(s)",
                self._run_id, generation, rank, settings.min_nodes, settings.max_nodes,
            )  # fmt: skip
        while sealed is None:
            timeout = _POLL if last_call is None else max(0.0, last_call - loop.time())
            result = await store.watch(sealed_key, revision, min(timeout, _POLL))
            revision = result.revision
            if result.compacted:
                if await store.get(self._round_key(generation, f"node/{rank}")) != mine:
                    log.warning("Rendezvous %s: the store lost round %d; joining again",
                                self._run_id, generation)  # fmt: skip
                    return None
                sealed = await store.get(sealed_key)
            else:
                sealed = next((e.value for e in result.events if e.value is not None), None)
            if sealed is not None:
                break
            if last_call is None:
                joined = int(await store.get(self._round_key(generation, "join")) or 0)
                if joined >= settings.min_nodes:
                    last_call = loop.time() + settings.last_call_timeout
            elif loop.time() >= last_call:
                joined = int(await store.get(self._round_key(generation, "join")) or 0)
                count = str(min(joined, settings.max_nodes)).encode()
                _, sealed = await store.compare_set(sealed_key, None, count)
        size = int(sealed)
        if rank >= size:
            log.info("Rendezvous %s: arrived after round %d was sealed; waiting for the next",
                     self._run_id, generation)  # fmt: skip
            if size < settings.max_nodes:  # there is room: end the round to admit us
                await self._advance(generation, f"node {self.node_id} wants to join")
            else:
                await self._end_if_abandoned(generation, size)
            await self._wait_for_generation_after(generation)
            return None
        return await self._read_round(generation, rank, size)

    async def _end_if_abandoned(self, generation: int, size: int) -> None:
        """End a full round whose members are gone, so a late arrival never waits on it."""
        keys = [self._round_key(generation, f"node/{i}") for i in range(size)]
        nodes = [json.loads(v) for v in await self.store.multi_get(keys) if v is not None]
        beats = await self.store.multi_get([self._hb_key(str(n["node"])) for n in nodes])
        if any(beat is None for beat in beats):
            await self._advance(generation, "a member of the full round is gone")

    def _pick_port(self) -> int:
        """A free port on our address, for the workers' store should we be group rank 0."""
        try:
            return free_port(self._addr)
        except OSError as exc:
            raise StartError(
                f"--local-addr: {self._addr!r} is not an address of this host ({exc.strerror})"
            ) from None

    async def _read_round(self, generation: int, rank: int, size: int) -> _Round:
        store = self.store
        keys = [self._round_key(generation, f"node/{i}") for i in range(size)]
        revision = await store.revision()
        values = await store.multi_get(keys)
        if any(value is None for value in values):  # an arrival between add and set
            await store.wait([k for k, v in zip(keys, values, strict=True) if v is None],
                             self.settings.join_timeout)  # fmt: skip
            revision = await store.revision()
            values = await store.multi_get(keys)
        nodes = tuple(json.loads(value or b"{}") for value in values)
        return _Round(generation, rank, size, nodes, revision)

    async def _advance(self, generation: int, reason: str) -> None:
        """End round ``generation`` (if it is still the current one) for every agent."""
        store = self.store
        moved, current = await store.compare_set(
            self._gen_key, str(generation).encode(), str(generation + 1).encode()
        )
        if moved:
            log.info("Rendezvous %s: ended round %d: %s", self._run_id, generation, reason)
        else:
            log.debug("Rendezvous %s: round %d had already ended (now %s)", self._run_id,
                      generation, current)  # fmt: skip

    async def _wait_for_generation_after(self, generation: int) -> None:
        """Return once the current generation is not ``generation`` (raise if closed)."""
        store = self.store
        while True:
            revision = await store.revision()
            if await self._generation() != generation:
                return
            await store.watch(self._ctl, revision, _POLL)
            # loop: re-read, so a compacted or restarted store cannot hide the change

    async def _timeout_message(self) -> str:
        settings = self.settings
        joined = "?"
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                generation = await self._generation()
                joined = (
                    await self.store.get(self._round_key(generation, "join")) or b"0"
                ).decode()
        return (
            f"rendezvous {self._run_id!r}: {joined} node(s) joined, "
            f"{settings.min_nodes}..{settings.max_nodes} needed, within "
            f"join_timeout={settings.join_timeout:g}s"
        )
