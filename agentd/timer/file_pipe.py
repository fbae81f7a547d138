"""The named-pipe timer protocol, wire-compatible with torch's ``FileTimerClient``.

One JSON object per line, written atomically (at most PIPE_BUF bytes)::

    {"version": 1, "pid": 123, "scope_id": "train.py#42", "expiration_time": 1700000000.5,
     "signal": 9}

``expiration_time`` is epoch seconds; -1 releases the timer. The agent's end of the pipe
(:mod:`agentd.timer.pipe`) reads the lines and hands what :func:`parse_line` makes of
them to its timer server. Bad input is logged, counted and dropped; it never stops other
timers from being enforced.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from dataclasses import dataclass

from agentd.timer.api import RELEASE, TimerClient, TimerRequest
from agentd.timer.settings import TIMER_FILE_ENV
from agentd.wire import progress as progress_wire
from agentd.wire.progress import ProgressMessage

PIPE_BUF = select.PIPE_BUF
MAX_SCOPE = 1024
MAX_PID = 1 << 22
"""Linux's PID_MAX_LIMIT: no pid is larger (and os.getpgid overflows past 2**31)."""
MAX_EXPIRATION = 1e12
"""Epoch seconds far past any real deadline (the year 33658), and far below float's range."""
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
