"""The agent's side of in-process restarts: a channel per worker, park and resume.

Every worker of a script entrypoint gets a channel (:mod:`agentd.inprocess.wire`); a worker
that calls :func:`agentd.inprocess.run` says ``hello`` on it. When the group restarts
(a failure, a hang, a membership change), :meth:`InProcessRestarts.park` asks every live
worker outside ``failed`` to park; if all of them opted in and park within
``park_timeout``, they are kept and only the others are stopped. The next attempt
:meth:`resume`\\ s each kept worker with its new variables, and new processes replace only
the ranks that were lost. Otherwise (a worker that did not opt in, or one stuck in native
code past the bound) the restart falls back to stopping every process, as without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentd.inprocess import wire
from agentd.support.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

QUICK_REPEATS = 3
QUICK_WINDOW = 60.0
"""After QUICK_REPEATS in-process restarts, each within QUICK_WINDOW seconds of the one
before, the next restart uses new processes: what the survivors kept may be what fails."""
PARK_TIMEOUT = 10.0
"""How long the survivors have to leave their training function (a collective in native
code returns first) before the restart falls back to new processes."""


class _Channel:
    """The agent's end of one worker's channel, read on the loop."""

    def __init__(self, on_error: Callable[[], None]) -> None:
        self.agent_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.worker_fd: int | None = worker_end.detach()
        self.agent_end.setblocking(False)
        self.opted_in = False
        self.broken = False
        self.parked: asyncio.Event = asyncio.Event()
        self.error: tuple[str, float] | None = None
        """What the worker's training function raised, and when the agent heard of it."""
        self._on_error = on_error
        self._buffer = b""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.agent_end.fileno(), self._readable)

    def spawned(self) -> None:
        """The worker holds its end now: the agent's copy goes."""
        if self.worker_fd is not None:
            os.close(self.worker_fd)
            self.worker_fd = None

    def send(self, op: str, **fields: object) -> bool:
        try:
            self.agent_end.sendall(wire.encode(op, **fields))
        except OSError:
            self.broken = True
            return False
        return True

    def _readable(self) -> None:
        try:
            data = self.agent_end.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._take(line)
        if len(self._buffer) > wire.MAX_LINE:
            self._take(self._buffer)

    def _take(self, line: bytes) -> None:
        try:
            message = wire.decode(line, wire.WORKER_OPS)
        except wire.ProtocolError as exc:
            log.warning("In-process channel: %s; restarting that worker as a process", exc)
            self.close()
            return
        if message["op"] == "hello":
            self.opted_in = True
        elif message["op"] == "error":
            self.error = (message.get("message") or "the training function raised", time.time())
            self._on_error()
        else:
            self.parked.set()

    def close(self) -> None:
        self.broken = True
        self._buffer = b""
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self.agent_end.fileno())
        self.agent_end.close()
        self.spawned()


class InProcessRestarts:
    """In-process restarts of one agent's workers (see the module docstring)."""

    def __init__(
        self, park_timeout: float = PARK_TIMEOUT, on_error: Callable[[], None] = lambda: None
    ) -> None:
        self.park_timeout = park_timeout
        self._on_error = on_error
        self._problems = RateLimitedLog(log)
        self._clock = time.monotonic
        self._quick: list[float] = []
        """When the recent in-process restarts happened, while each came soon after the last."""
        self._restarting = False
        self._channels: dict[int, _Channel] = {}
        self.parked: dict[int, WorkerProcess] = {}
        """The workers kept for the next attempt, by local rank."""
        self.kinds = {"in_process": 0, "process": 0}
        """Restarts so far by kind: the survivors kept, or every worker a new process."""

    @contextlib.contextmanager
    def restarting(self) -> Iterator[None]:
        """While the agent restarts its group, :meth:`park` keeps the workers it can."""
        before, self._restarting = self._restarting, True
        try:
            yield
        finally:
            self._restarting = before

    def plan(
        self, plans: list[tuple[Any, ...]], kept_ranks: frozenset[int] | None, grace: float
    ) -> None:
        """Give each new worker's plan its channel and ``grace`` (see
        :data:`~agentd.inprocess.wire.GRACE_ENV`), and tell every rank which global ranks
        are new processes and which kept rank hands them its state. ``kept_ranks`` are the
        ranks every node kept, as the round told it (None: the rendezvous cannot tell, and
        only a node that is the whole job knows them; elsewhere :func:`agentd.inprocess.sync`
        then does nothing, since every rank must agree on whether to call a collective)."""
        self.parked = {r: p for r, p in self.parked.items() if p.returncode is None}
        world = plans[0][0].world_size if plans else 0
        if kept_ranks is None and world == len(plans):
            kept_ranks = frozenset(w.global_rank for w, *_ in plans if w.local_rank in self.parked)
        replaced = sorted(set(range(world)) - kept_ranks) if kept_ranks else []
        source = str(min(kept_ranks)) if replaced and kept_ranks else ""
        for worker, _argv, env, *_, pass_fds in plans:
            env[wire.GRACE_ENV] = f"{grace:g}"
            # set even when empty: a kept worker must not keep the last attempt's values
            env[wire.REPLACED_ENV] = ",".join(map(str, replaced)) if source else ""
            env[wire.SOURCE_ENV] = source
            if worker.local_rank not in self.parked:
                fd, names = self.channel_for(worker.local_rank)
                env.update(names)
                pass_fds.append(fd)

    def keeping(self) -> list[int]:
        """The local ranks kept for the next attempt that are still alive."""
        return sorted(r for r, p in self.parked.items() if p.returncode is None)

    def resume_all(self, plans: Sequence[tuple[Any, ...]]) -> list[WorkerProcess]:
        """Resume every kept worker with its plan's variables; returns those resumed."""
        resumed = [self.parked[w.local_rank] for w, _argv, env, *_ in plans
                   if w.local_rank in self.parked and self.resume(w.local_rank, env)]  # fmt: skip
        self.parked = {}
        return resumed

    def channel_for(self, local_rank: int) -> tuple[int, dict[str, str]]:
        """A new worker's end of a fresh channel and the variable that names it."""
        old = self._channels.pop(local_rank, None)
        if old is not None:
            old.close()
        channel = _Channel(self._on_error)
        self._channels[local_rank] = channel
        assert channel.worker_fd is not None
        return channel.worker_fd, {wire.CHANNEL_FD_ENV: str(channel.worker_fd)}

    def spawned(self, local_ranks: Iterable[int]) -> None:
        for rank in local_ranks:
            if rank in self._channels:
                self._channels[rank].spawned()

    async def park(
        self, procs: Sequence[WorkerProcess], failed: Collection[int], fresh_store: bool
    ) -> dict[int, WorkerProcess]:
        """During a restart, park every live worker whose local rank is not in ``failed``;
        returns them by local rank, or nothing when any of them cannot be kept (then none
        is), or when the group is stopped for good. ``fresh_store``: every attempt's workers
        meet in a new store (the agent's); a store that outlives attempts (rank 0's worker
        hosts it under ``static``) would hand a kept rank the last attempt's keys."""
        if not self._restarting:
            return {}
        survivors = [p for p in procs if p.returncode is None and p.local_rank not in failed]
        channels = [self._channels.get(p.local_rank) for p in survivors]
        opted_in = any(c is not None and c.opted_in for c in channels)
        if opted_in and not fresh_store:
            self._problems.warning("store", "In-process restarts need the agent's workers' "
                                   "store (a fresh one per attempt), not one in rank 0's worker "
                                   "(--rdzv-backend static): restarting every worker as a new "
                                   "process")  # fmt: skip
            return self._fall_back(True)
        if not survivors or not all(c is not None and c.opted_in and not c.broken
                                    for c in channels):  # fmt: skip
            return self._fall_back(bool(survivors) and opted_in)
        now = self._clock()
        if self._quick and now - self._quick[-1] > QUICK_WINDOW:
            self._quick = []  # the last one held: the count starts again
        self._quick.append(now)
        if len(self._quick) > QUICK_REPEATS:
            log.warning("%d in-process restarts within %.0fs of each other; restarting every "
                        "worker as a new process", QUICK_REPEATS, QUICK_WINDOW)  # fmt: skip
            self._quick = []
            return self._fall_back(True)
        ready = [c for c in channels if c is not None]
        for channel in ready:
            channel.parked.clear()
            channel.send("park")
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(c.parked.wait()) for c in ready]
        exits: list[asyncio.Future[Any]] = [asyncio.ensure_future(asyncio.shield(p.exited))
                                            for p in survivors]  # fmt: skip
        try:
            async with asyncio.timeout(self.park_timeout):
                while not all(w.done() for w in waits):
                    await asyncio.wait([*waits, *exits], return_when=asyncio.FIRST_COMPLETED)
                    if any(e.done() for e in exits):
                        break
        except TimeoutError:
            pass
        finally:
            for task in (*waits, *exits):
                task.cancel()
        if not all(c.parked.is_set() and not c.broken for c in ready) or any(
            p.returncode is not None for p in survivors
        ):
            missing = [p.local_rank for p, c in zip(survivors, ready, strict=True)
                       if not c.parked.is_set()]  # fmt: skip
            log.warning("Local rank(s) %s did not park within %.1fs; restarting every worker "
                        "as a new process", missing, self.park_timeout)  # fmt: skip
            return self._fall_back(True)
        self.kinds["in_process"] += 1
        for channel in ready:
            channel.error = None
        self.parked = {p.local_rank: p for p in survivors}
        return dict(self.parked)

    def _fall_back(self, counted: bool) -> dict[int, WorkerProcess]:
        if counted:
            self.kinds["process"] += 1
        self.parked = {}
        return {}

    def raised(self) -> dict[int, tuple[str, float]]:
        """The workers whose training function raised (still alive, waiting to be parked):
        what, and when, by local rank."""
        return {rank: c.error for rank, c in self._channels.items() if c.error is not None}

    def resume(self, local_rank: int, env: Mapping[str, str]) -> bool:
        """Send the kept worker its new variables (those that differ from the agent's own);
        False if it cannot be told (it is then replaced)."""
        channel = self._channels.get(local_rank)
        if channel is None or channel.broken:
            return False
        delta = {k: v for k, v in env.items() if os.environ.get(k) != v}
        return channel.send("resume", env=delta)

    def forget(self, local_ranks: Iterable[int]) -> None:
        for rank in local_ranks:
            channel = self._channels.pop(rank, None)
            if channel is not None:
                channel.close()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.forget(list(self._channels))
        self.parked = {}
