"""The agent's end of the named pipe its workers write timer requests and heartbeats to:
made (a private one, or the path given), read as the loop reports it readable, split into
lines, and removed; and the sweep of pipes whose agents died.

This is all a job loads at start. What the lines say (:mod:`agentd.timer.file_pipe`, the
wire) is loaded with the first complete line, and what it feeds (the timer server, the
heartbeat service) is the reader's owner's to build then: a job whose workers never write
loads none of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentd.support import tempdirs

if TYPE_CHECKING:
    from agentd.timer.api import TimerRegistry
    from agentd.wire.progress import ProgressMessage

log = logging.getLogger(__name__)

PIPE_BUF = select.PIPE_BUF
"""Writes up to this size are atomic: one request is one write."""
PIPE_DIR_PREFIX = "agentd-timer-"
"""A private pipe's directory: ``agentd-timer-<agent pid>.<its start ticks>.<its PID
namespace>-<random>`` (:func:`~agentd.hygiene.orphans.agent_identity`)."""
_READ_SIZE = 1 << 16


def sweep_stale_pipe_dirs(folder: str) -> list[str]:
    """Remove the private pipe directories (``agentd-timer-<pid>.<start ticks>[.<PID
    namespace>]-*``, holding only named pipes, ours, and maybe a drain control file) of
    agents that are gone: one killed before its guardian started (it starts with the first
    workers) could not have its directory removed. An agent of another PID namespace (a
    container's, sharing the folder) is not judged by its pid, which names another process
    here or none, but by its lock on the directory (:func:`lock_dir`), which ends with it.
    Returns those removed."""
    from agentd.hygiene.guardian_process import remove_private_dir
    from agentd.hygiene.orphans import agent_alive, parse_identity, pid_namespace  # agent side

    ours = pid_namespace()
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.startswith(PIPE_DIR_PREFIX):
                continue
            owner = parse_identity(entry.name[len(PIPE_DIR_PREFIX) :].split("-", 1)[0])
            if owner is None:
                continue
            pid, ticks, namespace = owner
            if ticks is None:
                continue
            if namespace is None or namespace == ours:
                if agent_alive(pid, ticks):
                    continue
            elif _young(entry.path) or tempdirs.held(entry.path):
                continue
            if _ours(entry.path):
                remove_private_dir(entry.path)  # if it holds only what an agent leaves there
                if not os.path.lexists(entry.path):
                    removed.append(entry.path)
    return removed


FOREIGN_GRACE = 60.0
"""Seconds another PID namespace's pipe directory is left alone, whatever its lock says
(its agent locks it just after making it)."""


def lock_dir(path: str) -> int | None:
    """Lock the directory ``path`` for as long as this process lives (the descriptor to
    hold; None where the file system cannot): how an agent of another PID namespace tells
    that its maker lives."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if tempdirs.hold(fd):
        return fd
    os.close(fd)
    return None


def _young(path: str) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime < FOREIGN_GRACE
    except OSError:
        return True


def _ours(path: str) -> bool:
    """Whether ``path`` is a directory (not a link to one) that this user owns."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


OnProgress = Callable[["list[ProgressMessage]"], None]


class FifoSource:
    """Agent side: serves the named pipe and feeds its requests to ``registry`` (a timer
    server, or whoever builds one at the first request and makes it the registry), and its
    progress messages to ``on_progress`` (without one, they are dropped as unsupported).

    ``file_path`` None creates a private pipe (mode 0600 in a new 0700 directory). A given
    path is created if missing; an existing FIFO of ours is reused; anything else there is
    refused, never deleted.
    """

    def __init__(
        self,
        registry: TimerRegistry,
        file_path: str | None = None,
        on_progress: OnProgress | None = None,
    ) -> None:
        self.registry = registry
        self.on_progress = on_progress
        self._requested_path = file_path
        self.path = ""
        self._created_dir: str | None = None
        self._dir_lock: int | None = None
        self._created_fifo = False
        self._rfd = -1
        self._wfd = -1
        self._buffer = b""

    def open(self) -> str:
        """Create or check the pipe and start reading it; returns its path."""
        import asyncio

        from agentd.exceptions import StartError

        if self._requested_path is None:
            from agentd.hygiene.orphans import agent_identity

            self._created_dir = tempdirs.private_dir(f"{PIPE_DIR_PREFIX}{agent_identity()}-")
            self._dir_lock = lock_dir(self._created_dir)
            self.path = os.path.join(self._created_dir, "timer.fifo")
        else:
            self.path = os.path.abspath(self._requested_path)
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            try:
                os.mkfifo(self.path, 0o600)
            except OSError as exc:
                raise StartError(
                    f"timer_file: cannot create {self.path!r}: {exc.strerror}"
                ) from None
            self._created_fifo = True
        else:
            if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.getuid():
                raise StartError(
                    f"timer_file: {self.path!r} exists and is not a named pipe owned by uid "
                    f"{os.getuid()}; refusing to use or delete it"
                )
        self._rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._wfd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)  # never see end-of-file
        asyncio.get_running_loop().add_reader(self._rfd, self._on_readable)
        return self.path

    @property
    def is_open(self) -> bool:
        """Whether the pipe is served now (:meth:`open`, not yet :meth:`close`)."""
        return self._rfd >= 0

    @property
    def private_dir(self) -> str | None:
        """The private directory this source created for its pipe (None: a given path)."""
        return self._created_dir

    def close(self) -> None:
        """Stop reading; remove the pipe (and directory) if this source created them."""
        import asyncio

        if self._rfd >= 0:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._rfd)
            os.close(self._rfd)
            os.close(self._wfd)
            self._rfd = self._wfd = -1
        if self._created_fifo:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self._created_fifo = False
        if self._created_dir:
            from agentd.wire.control import NAME  # the agent may have made it here

            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._created_dir, NAME))
            with contextlib.suppress(OSError):
                os.rmdir(self._created_dir)
            self._created_dir = None
        if self._dir_lock is not None:
            os.close(self._dir_lock)
            self._dir_lock = None

    def drain(self) -> None:
        """Read what is waiting on the pipe now (nothing once closed)."""
        if self._rfd >= 0:
            self._on_readable()

    def _on_readable(self) -> None:
        while True:
            try:
                chunk = os.read(self._rfd, _READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.feed(chunk)
        self._bound_partial_line()

    def feed(self, chunk: bytes) -> None:
        """Take bytes from the pipe; complete lines become requests."""
        data = self._buffer + chunk
        *lines, self._buffer = data.split(b"\n")
        if not lines:
            return
        from agentd.timer.api import TimerRequest
        from agentd.timer.file_pipe import parse_line

        requests: list[TimerRequest] = []
        progress: list[ProgressMessage] = []
        for line in lines:
            if not line.strip():
                continue
            if len(line) >= PIPE_BUF:
                self.registry.count_bad("oversized", f"a line of {len(line)} bytes")
                line = line[-(PIPE_BUF - 1) :]  # a request glued at its end may survive
            try:
                request, problem = parse_line(line)
            except Exception as exc:  # one line must never cost the others
                request, problem = None, f"unreadable ({exc!r})"
            if problem:
                self.registry.count_bad("invalid", f"{problem}: {_excerpt(line)}")
            if isinstance(request, TimerRequest):
                requests.append(request)
            elif request is not None:
                progress.append(request)
        if requests:
            self.registry.register_timers(requests)
        if progress:
            self._take_progress(progress)

    def _take_progress(self, messages: list[ProgressMessage]) -> None:
        if self.on_progress is None:
            self.registry.count_bad("unsupported", "progress messages are not watched here")
            return
        try:
            self.on_progress(messages)
        except Exception:  # the pipe must go on serving the timers
            log.exception("Progress messages could not be handled")

    def _bound_partial_line(self) -> None:
        """A writer that never ends its line must not grow the buffer without bound."""
        if len(self._buffer) >= PIPE_BUF:
            self.registry.count_bad("oversized", f"an unfinished line of {len(self._buffer)} bytes")
            self._buffer = b""


def _excerpt(line: bytes, size: int = 80) -> Any:
    return line[:size] + (b"..." if len(line) > size else b"")
