"""The zygote's control channel: one JSON object per ``SOCK_SEQPACKET`` message, with
descriptors riding along as ``SCM_RIGHTS``.

Agent to zygote: ``{"fork": id, "argv", "env": {"set": {...}, "unset": [...]}, "cwd",
"fds": [target numbers], "gated": true}`` with one descriptor per target (stdin, stdout,
stderr, then the descriptors the worker inherits) and, when gated, the read end of the
gate last: the worker runs nothing of the user's until the agent writes to it (see
:func:`agentd.preload.child.become_worker`); ``{"taken": pid}`` once the agent sent a
request to that spare itself. Zygote to agent: ``{"ready": ...}`` once the preload is
done, ``{"failed": message}`` when it is not possible, ``{"forked": id, "pid"}`` with the
worker's pidfd, or ``{"forked": id, "error"}``, ``{"spare": pid}`` with a spare's pidfd and
the agent's end of its channel (a fork request sent there, as above, makes it that
worker), and ``{"exited": pid, "status"}`` (a wait status) for every child it reaps.
Both ends trust each other (a socketpair made by the
agent); a malformed message is still an error, never a crash.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
from collections.abc import Sequence
from typing import Any

MAX_MESSAGE = 256 * 1024
MAX_FDS = 64


class WireError(Exception):
    """A message that breaks the protocol."""


def socketpair() -> tuple[socket.socket, socket.socket]:
    """The agent's end and the zygote's end (the zygote's is inheritable)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
    theirs.set_inheritable(True)
    return ours, theirs


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """Send one message (raises BlockingIOError on a full non-blocking socket)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE // 2:
        raise WireError(f"message of {len(data)} bytes is over {MAX_MESSAGE // 2}")
    if len(fds) > MAX_FDS:
        raise WireError(f"{len(fds)} descriptors are over {MAX_FDS}")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and its descriptors; None at the end of the channel.

    Raises BlockingIOError when a non-blocking socket has nothing, WireError for a
    message that cannot be read (its descriptors are closed)."""
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(array.array("i", payload[:usable]))
    if not data and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise WireError("message truncated")
        message = json.loads(data)
        if not isinstance(message, dict):
            raise WireError("message is not a JSON object")
    except (ValueError, WireError) as exc:
        for fd in fds:
            os.close(fd)
        raise WireError(str(exc)) from None
    for fd in fds:
        os.set_inheritable(fd, False)
    return message, fds


def is_open(fd: int) -> bool:
    """Whether ``fd`` is an open descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def close_all(fds: Sequence[int]) -> None:
    """Close each of ``fds``, those already closed aside."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
