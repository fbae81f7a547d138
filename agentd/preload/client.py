"""The agent's side of a zygote: start it, fork workers from it, watch them by pidfd.

A worker forked by the zygote is not the agent's child, yet it is watched like one: its
pidfd (opened by the zygote before it could be reaped, so never for a reused pid) turns
its exit into an event on the loop the moment it happens; the zygote reports its wait
status. Should the zygote die, its workers die with it (their parent-death signal) and
are re-parented to the agent, which is a child subreaper: their status is then read from
the pidfd directly. Output is read from pipes the agent made, passed to the worker with
SCM_RIGHTS, so a forked worker's stdio is routed exactly as a spawned one's.

Where the zygote keeps spares (children forked ahead, each waiting on a channel of its
own that the zygote hands to the agent), a fork is a message to a spare: no fork and no
round trip through the zygote on a restart's path. The spare's pid is known before the
request is sent, and the worker still waits at its gate until the agent releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentd.exceptions import ConfigError, StartError
from agentd.preload import command, liveness, wire
from agentd.preload.command import PythonCommand
from agentd.preload.forked import ZygoteWorker, status_from_pidfd
from agentd.preload.spares import Spares
from agentd.workers.output import StreamRoute, StreamSink
from agentd.workers.processes import spawn_process

log = logging.getLogger(__name__)

_STATUS_WAIT = 2.0
"""Seconds to wait for the zygote's report of a wait status after the pidfd fired."""
_STOP_WAIT = 5.0
_ROOM_FOR_ARGV = 4096
"""Bytes the zygote's command line is padded with, so a worker can show its own in ``ps``."""


class Zygote:
    """One zygote process for ``cmd``'s interpreter and options, preloading ``modules``.

    ``env`` is the zygote's environment (the workers' common one, without their
    per-worker variables); each fork sends only what differs. ``on_lost(zygote, code)``
    is called when it dies while it was not asked to stop. It keeps ``spares`` children
    forked ahead, so that many forks cost no fork (see :mod:`agentd.preload.zygote`).
    """

    def __init__(
        self,
        cmd: PythonCommand,
        modules: Sequence[str],
        env: Mapping[str, str],
        on_lost: Callable[[Zygote, int | None], None] | None = None,
        spares: int = 0,
        cuda: bool = False,
    ) -> None:
        self.command = cmd
        self.spares_wanted = spares
        self.cuda = cuda
        """The spares initialise CUDA on their slot's device: one takes only its slot's
        local rank."""
        self.modules = tuple(modules)
        self.env = dict(env)
        self.pid: int | None = None
        self.ready_info: dict[str, Any] = {}
        self._on_lost = on_lost
        self._process: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._forks: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self._spares = Spares()
        """Children the zygote forked ahead: a fork takes one."""
        self._statuses: dict[int, asyncio.Future[int | None]] = {}
        """The zygote's report of each worker's wait status (None: it died first)."""
        self._ids = itertools.count(1)
        self._stopping = False
        self.alive = False
        self.answering = True
        """False once it did not answer (:mod:`agentd.preload.liveness`): what it was
        asked is asked again of its successor."""

    async def start(self, cwd: str) -> None:
        """Start the zygote (the preload goes on in the background: see :meth:`ready`)."""
        loop = asyncio.get_running_loop()
        ours, theirs = wire.socketpair()
        argv = [
            self.command.executable,
            *self.command.options,
            "-m",
            "agentd.preload.zygote",
            str(theirs.fileno()),
            self.command.path0(cwd),
            ",".join(self.modules),
            f"{self.spares_wanted}:cuda" if self.cuda else str(self.spares_wanted),
            self.command.target if self.command.kind == "script" else "-",
            " " * _ROOM_FOR_ARGV,
        ]
        try:
            self._process = await spawn_process(argv, self.env, cwd, pass_fds=[theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise StartError(f"--preload: could not start the zygote: {exc.strerror}") from exc
        finally:
            theirs.close()
        self.pid = self._process.pid
        self.alive = True
        ours.setblocking(False)
        self._sock = ours
        self._ready = loop.create_future()
        loop.add_reader(ours, self._on_readable)

    @property
    def spare_pids(self) -> list[int]:
        """The spares held now, oldest (the next one taken) first."""
        return self._spares.pids

    async def ready(self) -> dict[str, Any]:
        """Wait for the preload: its report, or ConfigError (a module failed to import,
        CUDA) or StartError (the zygote died first)."""
        assert self._ready is not None, "start() first"
        return await liveness.answered(self, self._ready, "its preload")

    async def fork(
        self,
        local_rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdout: StreamRoute,
        stderr: StreamRoute,
        cwd: str | None = None,
        pass_fds: Sequence[int] = (),
    ) -> ZygoteWorker:
        """A worker forked from the zygote, as :func:`~agentd.workers.processes.spawn_worker`
        spawns one, but held before the user's code until :meth:`ZygoteWorker.release`:
        the caller first makes its pid known (trusted) to the watchdog and heartbeats."""
        await self.ready()
        cmd = command.parse(argv)
        if (cmd.executable, cmd.options) != (self.command.executable, self.command.options):
            interpreter = " ".join([cmd.executable, *cmd.options])
            raise StartError(
                f"could not start worker {local_rank}: its interpreter "
                f"{interpreter} is not the zygote's"
            )
        cwd = cwd or os.getcwd()
        sinks = {fd: StreamSink(route) for fd, route in ((1, stdout), (2, stderr)) if route.piped}
        worker = ZygoteWorker(local_rank, sinks, self.exit_status)
        send_fds, close_after = [0], []
        reads: list[tuple[int, int]] = []  # (stream, read end): read once the request left
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
        worker.hold_at(gate_w)
        close_after.append(gate_r)
        try:
            if not wire.is_open(0):  # an agent without stdin: the worker reads /dev/null
                send_fds[0] = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                close_after.append(send_fds[0])
            for fd, route in ((1, stdout), (2, stderr)):
                if route.inherit and wire.is_open(fd):
                    send_fds.append(fd)
                elif route.piped:
                    read_end, write_end = os.pipe2(os.O_CLOEXEC)
                    close_after.append(write_end)
                    send_fds.append(write_end)
                    reads.append((fd, read_end))
                else:
                    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                    close_after.append(devnull)
                    send_fds.append(devnull)
            argv = list(argv)
            pid, pidfd = await self._start(
                local_rank,
                {
                    "kind": cmd.kind,
                    "target": cmd.target,
                    "args": list(cmd.args),
                    "argv": argv,
                    "path0": cmd.path0(cwd),
                    "cwd": cwd,
                    "env": self._env_change(env),
                    "fds": [0, 1, 2, *pass_fds],
                    "gated": True,
                },
                [*send_fds, *pass_fds, gate_r],
            )
        except BaseException:
            wire.close_all([read_end for _, read_end in reads])
            worker.abandon()
            raise
        finally:
            for fd in close_after:
                os.close(fd)
        worker.read_pipes(reads)
        worker.attach(pid, pidfd)
        return worker

    def _env_change(self, env: Mapping[str, str]) -> dict[str, Any]:
        base = self.env
        return {
            "set": {k: v for k, v in env.items() if base.get(k) != v},
            "unset": [k for k in base if k not in env],
        }

    async def _start(
        self, local_rank: int, message: dict[str, Any], fds: Sequence[int]
    ) -> tuple[int, int]:
        """Hand the request to a spare (the zygote is only told), else ask the zygote to
        fork: ``(pid, pidfd)`` of a worker that leads its group and waits at its gate.
        The spare of ``local_rank``'s slot is taken first; with CUDA, only that one."""
        if self.alive and self._sock is not None:
            request = {"fork": next(self._ids), **message}
            taken = await self._spares.take(request, fds, _send, local_rank, only=self.cuda)
            if taken is not None:
                with contextlib.suppress(OSError):  # a zygote gone does not need to know
                    await _send(self._sock, {"taken": taken[0]}, ())
                return taken
        return await self._request(message, fds)

    async def _request(self, message: dict[str, Any], fds: Sequence[int]) -> tuple[int, int]:
        if not self.alive or self._sock is None:
            raise StartError(f"the zygote (pid {self.pid}) is gone")
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        reply: asyncio.Future[tuple[int, int]] = loop.create_future()
        self._forks[request_id] = reply
        try:
            await _send(self._sock, {"fork": request_id, **message}, fds)
            return await liveness.answered(self, reply, "a fork", liveness.FORK_ANSWER)
        finally:
            self._forks.pop(request_id, None)

    async def kill(self) -> None:
        """End a zygote that does not answer: SIGKILL, reaped; its workers die with it
        (their parent-death signal), and ``on_lost`` is not called: the caller replaces it."""
        self._stopping = True
        self._lost()
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()

    async def exit_status(self, pid: int, pidfd: int) -> int:
        """The exit code of our worker ``pid`` (negative: its signal), once it exited."""
        loop = asyncio.get_running_loop()
        status = self._statuses.setdefault(pid, loop.create_future())
        if self.alive and not status.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STATUS_WAIT):
                    await asyncio.shield(status)
        self._statuses.pop(pid, None)
        code = status.result() if status.done() else None
        return code if code is not None else status_from_pidfd(pid, pidfd)

    # -- the channel -------------------------------------------------------------------------

    def _on_readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                received = wire.recv(self._sock)
            except BlockingIOError:
                return
            except wire.WireError as exc:
                log.warning("Zygote %s sent a bad message: %s", self.pid, exc)
                continue
            except OSError:
                received = None
            if received is None:
                self._lost()
                return
            self._dispatch(*received)

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        if "spare" in message and isinstance(message["spare"], int) and len(fds) == 2:
            slot = message.get("slot")
            self._spares.add(
                message["spare"], fds[0], fds[1], slot if isinstance(slot, int) else -1
            )
        elif "exited" in message and isinstance(message.get("status"), int):
            if self._spares.drop(int(message["exited"])):
                return
            status = self._statuses.setdefault(int(message["exited"]), loop.create_future())
            if not status.done():
                status.set_result(os.waitstatus_to_exitcode(message["status"]))
        elif "forked" in message:
            reply = self._forks.get(message["forked"])
            if reply is None or reply.done():  # a fork nobody waits for any more: end it
                if fds and "pid" in message:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fds[0], signal.SIGKILL)
                wire.close_all(fds)
            elif "error" in message or not fds:
                wire.close_all(fds)
                reply.set_exception(
                    StartError(f"the zygote could not fork: {message.get('error', 'no pidfd')}")
                )
            else:
                reply.set_result((int(message["pid"]), fds[0]))
                wire.close_all(fds[1:])
        elif "ready" in message and self._ready is not None and not self._ready.done():
            self.ready_info = message
            self._ready.set_result(message)
        elif "failed" in message and self._ready is not None and not self._ready.done():
            self._ready.set_exception(ConfigError(str(message["failed"])))
        else:
            wire.close_all(fds)

    def _lost(self) -> None:
        """The channel closed: the zygote is gone (or going)."""
        if not self.alive:
            return
        self.alive = False
        self._spares.close()
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            loop.remove_reader(self._sock)
            self._sock.close()
            self._sock = None
        for reply in self._forks.values():
            if not reply.done():
                reply.set_exception(StartError(f"the zygote (pid {self.pid}) died"))
        for status in self._statuses.values():  # wake the waiters: read their pidfds now
            if not status.done():
                status.set_result(None)  # not cancel(): it ended the waiter's task with it
        task = asyncio.ensure_future(self._report_loss())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _report_loss(self) -> None:
        code = await self._process.wait() if self._process is not None else None
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(
                StartError(
                    f"--preload: the zygote exited with {_describe(code)} before its preload "
                    "finished"
                )
            )
            self._ready.exception()  # retrieved: a failure nobody waits for is not an error
            return
        if not self._stopping and self._on_lost is not None:
            self._on_lost(self, code)

    async def stop(self) -> None:
        """Close the channel (the zygote exits; its workers, if any, die) and reap it; one
        still preloading has no worker and is not waited for: it is killed."""
        self._stopping = True
        preloading = self._ready is not None and not self._ready.done()
        self._lost()
        process = self._process
        if process is None:
            return
        if preloading:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        try:
            async with asyncio.timeout(_STOP_WAIT):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            wire.send(sock, message, fds)
            return
        except BlockingIOError:
            writable = loop.create_future()
            loop.add_writer(sock, writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(sock)


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"exit code {code}"
