"""In a spare (a standby worker): a child the zygote forked ahead of any request, which
waits for one.

It leads a session of its own at once, as a worker does, and spends its wait on what a
worker's start would otherwise pay on a restart's path: the copies of the pages it
shares with the zygote that taking a request on writes (:func:`rehearse`), and the
compilation of the job's script (:class:`ScriptAhead`), reused only while the file is
unchanged; with ``--standby-cuda``, CUDA's start-up as well (:mod:`agentd.preload.warm_cuda`).
Then it waits on its channel for a request (a message and its descriptors, as the agent
sent them) and becomes that worker (:func:`agentd.preload.child.become`).
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from agentd.preload import wire
from agentd.preload.child import ForkRequest, become, detach, show_command_line, start_failed


@dataclass(frozen=True)
class SpareStart:
    """What a spare does while it waits: compile ``script`` (the job's, where it runs a
    file), and with ``cuda`` initialise CUDA and make a context on its ``slot``'s device."""

    script: str | None = None
    slot: int = 0
    cuda: bool = False


def become_spare(
    channel: int, zygote_fds: Sequence[int], leading: int, start: SpareStart = SpareStart()
) -> NoReturn:
    """Set up, rehearse, compile the job's script, warm CUDA where asked, wait on
    ``channel`` for a request, and become that worker. The zygote closing ``channel``
    gives the spare up: it exits 0, having run nothing. Never returns."""
    try:
        title = f"agentd: standby worker {start.slot} of zygote {os.getppid()}"
        show_command_line([title])  # the zygote's pid is known only now
        detach(zygote_fds, leading)
        rehearse()
        ahead = ScriptAhead(start.script) if start.script else None
        if start.cuda:
            from agentd.preload.warm_cuda import warm_cuda

            device = warm_cuda(start.slot)
            if device is not None:  # ps tells a standby whose CUDA is ready
                show_command_line([f"{title} (cuda:{device} ready)"])
        received = _wait_for_request(channel)
        if received is None:
            os._exit(0)
        message, fds = received
        request = ForkRequest.from_message(message, len(fds))
    except BaseException as exc:
        start_failed(exc)
    become(request, fds, ahead)


def rehearse() -> None:
    """Do, on throwaway data, what taking a request on does: the first write to each page
    the spare shares with the zygote copies it (a page fault: about 0.4 ms of them for one
    worker's set-up on this VM), and a spare takes them while it waits, not on a
    restart's path. Nothing of it stays: the environment and the descriptors are as they
    were."""
    env = {"AGENTD_REHEARSAL": "1"}
    sample: dict[str, Any] = {
        "fork": 0,
        "kind": "script",
        "target": "rehearsal.py",
        "args": ["--flag", "value"],
        "argv": [sys.executable, "rehearsal.py"],
        "path0": "/",
        "cwd": "/",
        "env": {"set": env, "unset": []},
        "fds": [0, 1, 2],
        "gated": True,
    }
    ForkRequest.from_message(json.loads(json.dumps(sample)), 4)
    os.environ.update(env)
    del os.environ["AGENTD_REHEARSAL"]
    raw = io.FileIO(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), "wb")
    io.TextIOWrapper(io.BufferedWriter(raw), "utf-8", line_buffering=True).close()


class ScriptAhead:
    """The job's script, compiled while the spare waits, as Python compiles a script it
    runs (``dont_inherit``, the absolute path as its file name). The code is given only
    for that path, and only while the file is the one read (same inode, size and
    modification time, as Python checks a cached module): an edited script is compiled
    again at the start, as a spawned worker would."""

    def __init__(self, script: str) -> None:
        self.path = os.path.abspath(script)
        self.code: types.CodeType | None = None
        self.stamp: tuple[int, int, int] | None = None
        try:
            before = _stamp(self.path)
            with io.open_code(self.path) as fp:
                source = fp.read()
            code = compile(source, self.path, "exec", dont_inherit=True)
            if _stamp(self.path) == before:
                self.code, self.stamp = code, before
        except (OSError, SyntaxError, ValueError):  # the start compiles it and says why
            return

    def __call__(self, path: str) -> types.CodeType | None:
        if self.code is None or path != self.path:
            return None
        try:
            return self.code if _stamp(path) == self.stamp else None
        except OSError:
            return None


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _wait_for_request(channel: int) -> tuple[dict[str, Any], list[int]] | None:
    sock = socket.socket(fileno=channel)
    try:
        while True:
            try:
                return wire.recv(sock)
            except InterruptedError:
                continue
    finally:
        sock.close()
