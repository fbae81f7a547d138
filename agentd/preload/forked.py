"""A worker forked by the zygote, watched as a child is: its exit is an event on the
loop from its pidfd (the zygote reports the wait status), its output comes from pipes the
agent made; once re-parented to the agent (the zygote died), its status is read from the
pidfd directly, and from its zombie where the zygote lives but does not report it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from agentd.support.procfs import zombie_status
from agentd.workers.output import StreamSink
from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)


class ZygoteWorker(WorkerProcess):
    """A worker forked by the zygote: the exit comes from its pidfd, output from pipes."""

    def __init__(
        self,
        local_rank: int,
        sinks: Mapping[int, StreamSink],
        exit_status: Callable[[int, int], Awaitable[int]],
    ) -> None:
        super().__init__(local_rank, sinks)
        self._exit_status = exit_status
        """The zygote's report of ``(pid, pidfd)``'s wait status."""
        self._pipes: list[asyncio.BaseTransport] = []
        self._connecting: asyncio.Future[None] | None = None
        self._pidfd = -1
        self._gate = -1
        """The write end of the pipe the worker waits on before the user's code."""

    def hold_at(self, gate: int) -> None:
        """The worker waits for a byte on ``gate``'s read end: :meth:`release` writes it."""
        self._gate = gate

    def release(self) -> None:
        """Let the worker run the user's code (once; it was held since its fork)."""
        self._close_gate(b"1")

    def _close_gate(self, word: bytes = b"") -> None:
        """Write ``word`` to the gate and close it; without one, the held worker is given
        up: it exits having run nothing of the user's."""
        gate, self._gate = self._gate, -1
        if gate < 0:
            return
        if word:
            with contextlib.suppress(OSError):  # it died at the gate: its exit says so
                os.write(gate, word)
        os.close(gate)

    def read_pipes(self, reads: Sequence[tuple[int, int]]) -> None:
        """Feed this worker's streams (1 or 2) from the pipes' read ends, ``(stream, read
        end)``: connected on the loop's next turns, so the worker can be let go at once
        (what it writes meanwhile waits in the pipes)."""
        self._open_pipes.update(fd for fd, _ in reads)
        self._connecting = asyncio.ensure_future(self._connect(list(reads)))
        self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _connect(self, reads: list[tuple[int, int]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while reads:
                fd, read_end = reads.pop(0)
                pipe = os.fdopen(read_end, "rb", buffering=0)
                try:
                    reader = functools.partial(_PipeReader, self, fd)
                    transport, _ = await loop.connect_read_pipe(reader, pipe)
                except BaseException:
                    pipe.close()
                    raise
                self._pipes.append(transport)
        except BaseException:  # cancelled (given up): the pipes not read yet are closed
            for _, read_end in reads:
                os.close(read_end)
            raise

    def attach(self, pid: int, pidfd: int) -> None:
        """The worker runs as ``pid``: watch its exit through ``pidfd`` (now ours)."""
        self.pid = pid
        self._pidfd = pidfd
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)

    def _on_exit(self) -> None:
        at = time.time()
        asyncio.get_running_loop().remove_reader(self._pidfd)
        task = asyncio.ensure_future(self._collect(at))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _collect(self, at: float) -> None:
        try:
            code = await self._exit_status(self.pid, self._pidfd)
        finally:
            os.close(self._pidfd)
            self._pidfd = -1
            self._close_gate()
        self.set_exit(code, at)

    def abandon(self) -> None:
        """Never forked: close what was opened for it."""
        self._close_gate()
        if self._connecting is not None:
            self._connecting.cancel()
        for transport in self._pipes:
            transport.close()
        for sink in self.sinks.values():
            sink.close()

    async def drain(self) -> None:
        if self._connecting is not None:
            await asyncio.gather(self._connecting, return_exceptions=True)
        await super().drain()
        for transport in self._pipes:
            transport.close()


class _PipeReader(asyncio.Protocol):
    def __init__(self, worker: ZygoteWorker, fd: int) -> None:
        self._worker, self._fd = worker, fd

    def data_received(self, data: bytes) -> None:
        self._worker.pipe_data_received(self._fd, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._worker.pipe_connection_lost(self._fd, exc)


def status_from_pidfd(pid: int, pidfd: int) -> int:
    """The exit code of a worker the zygote did not report: read from the pidfd where the
    worker was re-parented to us (the zygote died), else from the zombie the zygote has
    not reaped (the zygote lives but does not answer: stopped, say); SIGKILL's when the
    status went with the zygote."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)  # type: ignore[attr-defined]
    except (ChildProcessError, OSError):
        info = None
    if info is None:
        code = zombie_status(pid)
        if code is not None:
            log.info("Exit status of worker pid %d read from its zombie: %d", pid, code)
            return code
        log.warning("Exit status of worker pid %d was lost with the zygote; taken as SIGKILL", pid)
        return -signal.SIGKILL
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)
