"""The named-pipe timer protocol, wire-compatible with torch's ``FileTimerClient``.

One JSON object per line, written atomically (at most PIPE_BUF bytes)::

    {"version": 1, "pid": 123, "scope_id": "train.py#42", "expiration_time": 1700000000.5,
     "signal": 9}

``expiration_time`` is epoch seconds; -1 releases the timer. The server keeps the pipe
open for reading (and for writing, so it never sees end-of-file), drains it as the loop
reports it readable, and hands valid requests to its :class:`TimerServer`. Bad input is
logged, counted and dropped; it never stops other timers from being enforced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentd.timer.api import RELEASE, TIMER_FILE_ENV, TimerClient, TimerRegistry, TimerRequest
from agentd.wire import progress as progress_wire
from agentd.wire.progress import ProgressMessage

log = logging.getLogger(__name__)

PIPE_BUF = select.PIPE_BUF
MAX_SCOPE = 1024
MAX_PID = 1 << 22
"""Linux's PID_MAX_LIMIT: no pid is larger (and os.getpgid overflows past 2**31)."""
MAX_EXPIRATION = 1e12
"""Epoch seconds far past any real deadline (the year 33658), and far below float's range."""
PIPE_DIR_PREFIX = "agentd-timer-"
"""A private pipe's directory: ``agentd-timer-<agent pid>.<its start ticks>-<random>``."""
_READ_SIZE = 1 << 16
_RECOVERY_TRIES = 8


class BadRequest(ValueError):
    """A line on the timer pipe that is not a valid request (the message names the rule)."""


def encode_request(request: TimerRequest) -> bytes:
    """The wire form of ``request``, newline included."""
    line = json.dumps(
        {
            "version": 1,
            "pid": request.worker_id,
            "scope_id": request.scope_id,
            "expiration_time": request.expiration_time,
            "signal": request.signal,
        }
    ).encode()
    if len(line) + 1 > PIPE_BUF:
        raise ValueError(f"timer request is {len(line) + 1} bytes; the pipe takes {PIPE_BUF}")
    return line + b"\n"


def parse_request(line: bytes) -> TimerRequest | ProgressMessage:
    """One wire line (without its newline) as a timer request (version 1) or a progress
    message (version 2, see :mod:`agentd.wire.progress`); :class:`BadRequest`
    otherwise."""
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("not JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest("not a JSON object")
    version = doc.get("version")
    if version == progress_wire.VERSION:
        try:
            return progress_wire.parse(doc, MAX_PID)
        except progress_wire.BadMessage as exc:
            raise BadRequest(str(exc)) from None
    if version != 1:
        raise BadRequest(f"version: {version!r} must be 1 (a timer request) or 2 (progress)")
    # Numbers are range-checked as Python numbers before any conversion: a pid of 2**64 or a
    # 400-digit deadline must be refused here, not overflow in os.getpgid() or float().
    pid = doc.get("pid")
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        raise BadRequest(f"pid: {pid!r} must be a positive integer up to {MAX_PID}")
    scope = doc.get("scope_id")
    if not isinstance(scope, str) or len(scope) > MAX_SCOPE:
        raise BadRequest(f"scope_id: must be a string of at most {MAX_SCOPE} characters")
    when = doc.get("expiration_time")
    if (
        not isinstance(when, int | float)
        or isinstance(when, bool)
        or not (when == RELEASE or 0 <= when <= MAX_EXPIRATION)
    ):
        raise BadRequest(
            f"expiration_time: {_number(when)} must be -1 or epoch seconds "
            f"within 0..{MAX_EXPIRATION:g}"
        )
    sig = doc.get("signal", int(signal.SIGKILL))
    if type(sig) is not int or not -signal.NSIG < sig < signal.NSIG:
        raise BadRequest(
            f"signal: {sig!r} must be an integer within {-signal.NSIG + 1}..{signal.NSIG - 1}"
        )
    return TimerRequest(pid, scope, float(when), sig)


def _number(value: object) -> str:
    """``value`` for an error message; an integer too long to print is described."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"<a {len(str(abs(value)))}-digit integer>"
    return repr(value)


def parse_line(line: bytes) -> tuple[TimerRequest | ProgressMessage | None, str | None]:
    """A request (or progress message) and/or why (part of) the line was bad.

    A writer that left a partial line glues it to the next writer's request, which is a
    flat object at the end of the line: trying the last few ``{`` from the right finds it.
    """
    try:
        return parse_request(line), None
    except BadRequest as exc:
        start = len(line)
        for _ in range(_RECOVERY_TRIES):
            start = line.rfind(b"{", 0, start)
            if start <= 0:
                break
            with contextlib.suppress(BadRequest):
                return parse_request(line[start:]), f"dropped {start} stray bytes before a request"
        return None, str(exc)


@dataclass(frozen=True)
class FileTimerRequest:
    """torch's request on the pipe: ``signal`` 0 (the default) means report, do not kill."""

    worker_pid: int
    scope_id: str
    expiration_time: float
    signal: int = 0

    def as_timer_request(self) -> TimerRequest:
        return TimerRequest(self.worker_pid, self.scope_id, self.expiration_time, self.signal)

    def to_json(self) -> str:
        return encode_request(self.as_timer_request()).decode().rstrip("\n")


def sweep_stale_pipe_dirs(folder: str) -> list[str]:
    """Remove the private pipe directories (``agentd-timer-<pid>.<start ticks>-*``, holding
    only named pipes, ours) of agents that are gone: one killed before its guardian started
    (it starts with the first workers) could not have its directory removed. Returns them."""
    from agentd.hygiene.orphans import agent_alive  # agent side only: workers import this module

    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.startswith(PIPE_DIR_PREFIX):
                continue
            owner = entry.name[len(PIPE_DIR_PREFIX) :].split("-", 1)[0]
            pid, _, ticks = owner.partition(".")
            if not (pid.isdigit() and ticks.isdigit()) or agent_alive(int(pid), int(ticks)):
                continue
            if not _only_our_fifos(entry.path):
                continue
            with contextlib.suppress(OSError):
                for leftover in os.listdir(entry.path):
                    os.unlink(os.path.join(entry.path, leftover))
                os.rmdir(entry.path)
                removed.append(entry.path)
    return removed


def _only_our_fifos(path: str) -> bool:
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        return all(
            stat.S_ISFIFO(os.lstat(os.path.join(path, name)).st_mode) for name in os.listdir(path)
        )
    except OSError:
        return False


class FileTimerClient(TimerClient):
    """Worker side: writes requests to the agent's named pipe (torch's wire format)."""

    def __init__(self, file_path: str | None = None, signal: int = int(signal.SIGKILL)) -> None:
        path = file_path or os.environ.get(TIMER_FILE_ENV)
        if not path:
            raise ValueError(f"file_path: none given and {TIMER_FILE_ENV} is not set")
        self._file_path = path
        self.signal = signal

    def _send(self, request: TimerRequest) -> None:
        data = encode_request(request)
        try:
            fd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise BrokenPipeError(
                f"timer server at {self._file_path} is not available ({exc.strerror})"
            ) from exc
        try:
            os.write(fd, data)  # one write of <= PIPE_BUF bytes: atomic
        finally:
            os.close(fd)

    def _send_request(self, request: TimerRequest | FileTimerRequest) -> None:
        """torch's name: send one request as it is (any pid, any signal)."""
        if isinstance(request, FileTimerRequest):
            request = request.as_timer_request()
        self._send(request)

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._send(TimerRequest(os.getpid(), scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        self._send(TimerRequest(os.getpid(), scope_id, RELEASE, 0))


OnProgress = Callable[[list[ProgressMessage]], None]


class FifoSource:
    """Agent side: serves the named pipe and feeds its requests to a timer server, and its
    progress messages to ``on_progress`` (without one, they are dropped as unsupported).

    ``file_path`` None creates a private pipe (mode 0600 in a new 0700 directory). A given
    path is created if missing; an existing FIFO of ours is reused; anything else there is
    refused, never deleted.
    """

    def __init__(
        self,
        server: TimerRegistry,
        file_path: str | None = None,
        on_progress: OnProgress | None = None,
    ) -> None:
        self._server = server
        self.on_progress = on_progress
        self._requested_path = file_path
        self.path = ""
        self._created_dir: str | None = None
        self._created_fifo = False
        self._rfd = -1
        self._wfd = -1
        self._buffer = b""

    def open(self) -> str:
        """Create or check the pipe and start reading it; returns its path."""
        import asyncio

        from agentd.exceptions import StartError

        if self._requested_path is None:
            from agentd.hygiene.orphans import process_start_ticks
            from agentd.support.tempdirs import private_dir

            owner = f"{os.getpid()}.{process_start_ticks(os.getpid())}"
            self._created_dir = private_dir(f"{PIPE_DIR_PREFIX}{owner}-")
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
            with contextlib.suppress(OSError):
                os.rmdir(self._created_dir)
            self._created_dir = None

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
        requests: list[TimerRequest] = []
        progress: list[ProgressMessage] = []
        for line in lines:
            if not line.strip():
                continue
            if len(line) >= PIPE_BUF:
                self._server.count_bad("oversized", f"a line of {len(line)} bytes")
                line = line[-(PIPE_BUF - 1) :]  # a request glued at its end may survive
            try:
                request, problem = parse_line(line)
            except Exception as exc:  # one line must never cost the others
                request, problem = None, f"unreadable ({exc!r})"
            if problem:
                self._server.count_bad("invalid", f"{problem}: {_excerpt(line)}")
            if isinstance(request, TimerRequest):
                requests.append(request)
            elif request is not None:
                progress.append(request)
        if requests:
            self._server.register_timers(requests)
        if progress:
            self._take_progress(progress)

    def _take_progress(self, messages: list[ProgressMessage]) -> None:
        if self.on_progress is None:
            self._server.count_bad("unsupported", "progress messages are not watched here")
            return
        try:
            self.on_progress(messages)
        except Exception:  # the pipe must go on serving the timers
            log.exception("Progress messages could not be handled")

    def _bound_partial_line(self) -> None:
        """A writer that never ends its line must not grow the buffer without bound."""
        if len(self._buffer) >= PIPE_BUF:
            self._server.count_bad("oversized", f"an unfinished line of {len(self._buffer)} bytes")
            self._buffer = b""


def _excerpt(line: bytes, size: int = 80) -> Any:
    return line[:size] + (b"..." if len(line) > size else b"")
