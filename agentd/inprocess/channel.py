"""The agent's end of one worker's in-process channel (:mod:`agentd.inprocess.wire`):
read on the event loop, it records what the worker said (``hello``, ``error``,
``parked``) and whether the channel broke, or closed because the worker's process is on
its way out; :func:`wait_settled` waits for a park's answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentd.inprocess import wire

if TYPE_CHECKING:
    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

EFFECT_AFTER_CAUSE = 1e-6
"""How much later than a close read in the same turn of the loop an error is stamped: a
worker's death makes its peers' collectives raise, so the death comes first (a training
function that raises parks its process, which does not close its channel)."""
READS_PER_TURN = 16
"""Reads of up to 64 KiB one channel gets in one turn of the loop: enough for every
message pending and the close behind them, not a worker that floods its channel."""


class ReadClock:
    """One time for all that the agent reads from its channels in one turn of the event
    loop. What is read together was pending together: the order of the reads is the
    order the selector gave, not the order the workers wrote in, so stamped one by one
    a peer's error could precede the close of the dying worker that caused it."""

    def __init__(self) -> None:
        self._now: float | None = None

    def __call__(self) -> float:
        if self._now is None:
            self._now = time.time()
            asyncio.get_running_loop().call_soon(self._turn_over)  # runs in the next turn
        return self._now

    def _turn_over(self) -> None:
        self._now = None


class Channel:
    """The agent's end of one worker's channel, read on the loop; ``clock`` stamps what
    it reads (a :class:`ReadClock` shared by the agent's channels)."""

    def __init__(
        self, on_error: Callable[[], None], clock: Callable[[], float] = time.time
    ) -> None:
        self.agent_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.worker_fd: int | None = worker_end.detach()
        self.agent_end.setblocking(False)
        self.opted_in = False
        self.broken = False
        self.closed_by_worker: float | None = None
        """When the worker's end closed (epoch seconds): its process is exiting or gone."""
        self.parked: asyncio.Event = asyncio.Event()
        self.settled: asyncio.Event = asyncio.Event()
        """Set once the worker parked or its channel broke: nothing more to wait for."""
        self.error: tuple[str, float] | None = None
        """What the worker's training function raised, and when the agent heard of it."""
        self._on_error = on_error
        self._clock = clock
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
            self.closed_by_worker = time.time()
            self.close()
            return False
        return True

    def _readable(self) -> None:
        """Read what is pending, the close included: a close read a turn after the
        worker's last message was stamped after what its peers said in that turn."""
        now = self._clock()
        for _ in range(READS_PER_TURN):
            try:
                data = self.agent_end.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.closed_by_worker = now
                self.close()
                return
            self._buffer += data
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                self._take(line, now)
            if len(self._buffer) > wire.MAX_LINE:
                self._take(self._buffer, now)
            if self.broken:
                return

    def _take(self, line: bytes, now: float) -> None:
        if self.broken:
            return
        try:
            message = wire.decode(line, wire.WORKER_OPS)
        except wire.ProtocolError as exc:
            log.warning("In-process channel: %s; restarting that worker as a process", exc)
            self.close()
            return
        if message["op"] == "hello":
            self.opted_in = True
        elif message["op"] == "error":
            what = message.get("message") or "the training function raised"
            self.error = (what, now + EFFECT_AFTER_CAUSE)
            self._on_error()
        else:
            self.parked.set()
            self.settled.set()

    def close(self) -> None:
        if self.broken:
            return
        self.broken = True
        self.settled.set()
        self._buffer = b""
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self.agent_end.fileno())
        self.agent_end.close()
        self.spawned()

    def why_not_kept(self) -> str | None:
        """Why this worker cannot be kept on its own account (None: it can, so far)."""
        if not self.opted_in:
            return "not_opted_in"
        if self.closed_by_worker is not None:
            return "channel_closed"
        if self.broken:
            return "broken_channel"
        return None


async def wait_settled(
    channels: Mapping[int, Channel], procs: Mapping[int, WorkerProcess], within: float
) -> list[int]:
    """Wait until every worker of ``channels`` (by local rank; its process in ``procs``)
    parked, closed its channel or exited; returns the local ranks that did none of these
    ``within`` seconds."""
    waits: dict[int, asyncio.Future[Any]] = {
        r: asyncio.ensure_future(c.settled.wait()) for r, c in channels.items()
    }
    exits: dict[int, asyncio.Future[Any]] = {
        r: asyncio.ensure_future(asyncio.shield(procs[r].exited)) for r in channels
    }
    pending = set(channels)
    try:
        async with asyncio.timeout(within):
            while pending:
                await asyncio.wait(
                    [*(waits[r] for r in pending), *(exits[r] for r in pending)],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                pending = {r for r in pending if not (waits[r].done() or exits[r].done())}
    except TimeoutError:
        pass
    finally:
        for task in (*waits.values(), *exits.values()):
            task.cancel()
    return sorted(pending)
