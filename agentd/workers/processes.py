"""Worker processes: spawn them, see their exits, and stop them with the one stop policy.

Every worker is the leader of its own session and process group, gets SIGKILL when the
agent dies (parent-death signal), and is watched through asyncio's subprocess protocol:
its exit is an event on the loop (a pidfd on Linux), seen the moment it happens even while
a grandchild still holds its output pipes. Stopping sends the stop signal to each whole
process group, waits up to ``stop_timeout``, then SIGKILLs the groups -- also those whose
leader already exited, so its children die too -- and always reaps, even when cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentd.exceptions import StartError
from agentd.hygiene.orphans import kill_marked, set_parent_death_signal
from agentd.support.aio import use_pidfd_child_watcher
from agentd.support.child_signals import apply_in_child
from agentd.support.fdlimits import restore_for_child
from agentd.workers.output import StreamRoute, StreamSink

log = logging.getLogger(__name__)

_GROUP_POLL_INTERVAL = 0.01
_PIPE_DRAIN_TIMEOUT = 1.0


class WorkerProcess(asyncio.SubprocessProtocol):
    """One worker: its output sinks, its exit (code and time) and its pipes' end."""

    def __init__(self, local_rank: int, sinks: Mapping[int, StreamSink]) -> None:
        loop = asyncio.get_running_loop()
        self.local_rank = local_rank
        self.sinks = dict(sinks)
        self.exited: asyncio.Future[int] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self.started_at = time.time()
        self.exited_at: float | None = None
        self.returncode: int | None = None
        self.pid = -1
        self._transport: asyncio.SubprocessTransport | None = None
        self._open_pipes: set[int] = set()

    @property
    def pgid(self) -> int:
        return self.pid

    def release(self) -> None:
        """Let a worker held before the user's code run it; a spawned worker is never
        held (it runs from its start): nothing to do."""

    @property
    def stderr(self) -> StreamSink | None:
        return self.sinks.get(2)

    # asyncio.SubprocessProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport
        self.pid = transport.get_pid()
        self._open_pipes = {fd for fd in (1, 2) if transport.get_pipe_transport(fd) is not None}
        if not self._open_pipes:
            self.pipes_closed.set_result(None)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.sinks[fd].feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in self.sinks:
            self.sinks[fd].close()
        self._open_pipes.discard(fd)
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        assert self._transport is not None
        self.set_exit(self._transport.get_returncode())

    def set_exit(self, returncode: int | None, at: float | None = None) -> None:
        """The worker exited with ``returncode`` (negative: the signal) at ``at`` (now)."""
        self.exited_at = at if at is not None else time.time()
        self.returncode = returncode
        if not self.exited.done():
            self.exited.set_result(returncode if returncode is not None else -1)

    async def drain(self) -> None:
        """After the exit: let the output pipes reach their end (bounded), then close."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_PIPE_DRAIN_TIMEOUT):
                await asyncio.shield(self.pipes_closed)
        for sink in self.sinks.values():
            sink.close()
        if self._transport is not None:
            self._transport.close()


async def spawn_worker(
    local_rank: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: StreamRoute,
    stderr: StreamRoute,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> WorkerProcess:
    """Start one worker in a new session with a parent-death signal; output flows at once.
    ``pass_fds`` stay open in the worker under the same numbers."""
    use_pidfd_child_watcher()
    loop = asyncio.get_running_loop()
    sinks = {fd: StreamSink(route) for fd, route in ((1, stdout), (2, stderr)) if route.piped}
    try:
        _, worker = await loop.subprocess_exec(
            lambda: WorkerProcess(local_rank, sinks),
            *argv,
            stdin=None,
            stdout=_stdio(stdout),
            stderr=_stdio(stderr),
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=functools.partial(_in_child, os.getpid()),
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        for sink in sinks.values():
            sink.close()
        raise StartError(f"could not start worker {local_rank}: {argv[0]}: {exc.strerror}") from exc
    return worker


async def spawn_process(
    argv: Sequence[str], env: Mapping[str, str], cwd: str | None, pass_fds: Sequence[int] = ()
) -> asyncio.subprocess.Process:
    """A helper of the agent's (not a worker): in a session of its own, with no stdin, the
    agent's stdout and stderr, and the workers' parent-death signal and limits."""
    use_pidfd_child_watcher()
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        preexec_fn=functools.partial(_in_child, os.getpid()),
        pass_fds=tuple(pass_fds),
    )


def _in_child(agent: int) -> None:
    """In the forked worker, before exec: die with the agent (pid ``agent``, read before the
    fork), see the agent's original open files limit (the agent raised its own), and
    ignore the drain signals meant for the agent (:mod:`agentd.support.child_signals`)."""
    set_parent_death_signal(agent)
    restore_for_child()
    apply_in_child()


def _stdio(route: StreamRoute) -> int | None:
    if route.inherit:
        return None
    return subprocess.PIPE if route.piped else subprocess.DEVNULL


def signal_groups(pgids: Sequence[int], sig: int) -> None:
    """Send ``sig`` to each process group; groups already gone are skipped."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_runs(worker: WorkerProcess) -> bool:
    """Whether a process of the exited ``worker``'s group runs. Its zombie counts while
    its parent does not reap it (a stopped zygote's worker): the group is looked through
    then, so an exit nobody reaps yet does not hold the stop for its whole timeout."""
    if not group_alive(worker.pgid):
        return False
    from agentd.support.procfs import runs_in_group, zombie_status  # seldom needed

    if worker.pid < 0 or zombie_status(worker.pid) is None:
        return True
    return runs_in_group(worker.pgid)


async def stop_workers(
    workers: Sequence[WorkerProcess],
    stop_signal: int = signal.SIGTERM,
    stop_timeout: float = 30.0,
    force: asyncio.Event | None = None,
    mark: str | None = None,
    spare_groups: Collection[int] = (),
) -> list[int]:
    """The stop policy, for every path: signal the groups, wait, SIGKILL the groups, reap.

    The stop signal is followed by SIGCONT, as systemd sends it: a stopped process (a
    ``kill -STOP``, a job-control stop) holds the stop signal pending until it runs
    again, and would otherwise wait out the whole ``stop_timeout`` for its SIGKILL.
    Waits at most ``stop_timeout`` seconds (on the loop's monotonic clock) for every process
    of every group to be gone; ``force`` being set cuts the wait short. With ``mark``, the
    processes carrying that owner mark that left their group (``setsid``) are killed too,
    but those in ``spare_groups`` (workers kept across an in-process restart); their pids
    are returned. Survives cancellation: the groups are still killed, the workers
    reaped and their pipes closed.
    """
    strays: list[int] = []
    if not workers:
        return strays
    loop = asyncio.get_running_loop()
    pgids = [w.pgid for w in workers]
    deadline = loop.time() + stop_timeout
    signal_groups(pgids, stop_signal)
    if stop_signal not in (signal.SIGKILL, signal.SIGCONT):
        signal_groups(pgids, signal.SIGCONT)
    try:
        await _wait_groups_gone(workers, deadline, force)
    finally:
        if loop.time() >= deadline:
            _say_killed(workers, stop_signal, stop_timeout)
        signal_groups(pgids, signal.SIGKILL)
        if mark is not None:
            strays = kill_marked(lambda m: m == mark, spare_groups=spare_groups)
        await asyncio.shield(asyncio.gather(*(w.exited for w in workers)))
        await asyncio.shield(asyncio.gather(*(w.drain() for w in workers)))
    return strays


def _say_killed(workers: Sequence[WorkerProcess], stop_signal: int, stop_timeout: float) -> None:
    """Log the workers still running when the stop's time is up (the SIGKILL that follows
    would otherwise be silent: a rank blocked in native code, say a collective whose peer
    is gone, runs no Python signal handler)."""
    running = [w for w in workers if w.returncode is None]
    if running:
        log.warning(
            "Local rank(s) %s (pid(s) %s) still ran %gs after %s (--stop-timeout): killing "
            "them with SIGKILL",
            [w.local_rank for w in running],
            ", ".join(str(w.pid) for w in running),
            stop_timeout,
            signal.Signals(stop_signal).name,
        )


async def _wait_groups_gone(
    workers: Sequence[WorkerProcess], deadline: float, force: asyncio.Event | None
) -> None:
    loop = asyncio.get_running_loop()
    force_task = asyncio.ensure_future(force.wait()) if force is not None else None
    try:
        exits: list[asyncio.Future[Any]] = [w.exited for w in workers]
        while pending := {f for f in exits if not f.done()}:
            remaining = deadline - loop.time()
            if remaining <= 0 or (force_task is not None and force_task.done()):
                return
            waits: set[asyncio.Future[Any]] = set(pending)
            if force_task is not None:
                waits.add(force_task)
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        # The leaders are gone; their groups may still hold children, whose exits are not
        # ours to await: look every few milliseconds until the groups are empty.
        while any(_group_runs(w) for w in workers):
            if loop.time() >= deadline or (force_task is not None and force_task.done()):
                return
            await asyncio.sleep(_GROUP_POLL_INTERVAL)
    finally:
        if force_task is not None:
            force_task.cancel()
