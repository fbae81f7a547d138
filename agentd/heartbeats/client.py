"""Worker side of hang detection: ``heartbeat()`` once per step, ``section(name)`` for phases.

Under ``agentd run`` the agent watches every worker that heartbeats: a worker silent for
longer than its timeout (learned from the intervals it observed, or set by flags) is
taken for hung; the agent then dumps every local worker's Python stacks and restarts the
group per its restart policy. Without agentd (plain ``python``, ``torchrun``) every call
here is a no-op, so a script can be instrumented unconditionally::

    import agentd

    for batch in loader:
        train_step(batch)
        agentd.heartbeat()
        if step % 1000 == 0:
            with agentd.section("checkpoint"):
                save(model)

A heartbeat costs a clock read and a comparison: one message goes to the agent at most
every :data:`SEND_INTERVAL` seconds, carrying the number of steps so far. Entering and
leaving a section always sends one (a few microseconds): sections are for phases, not for
every operation. The first call that sends registers :mod:`faulthandler` on the signal
the agent chose (``$AGENTD_DUMP_SIGNAL``), writing every thread's stack to
``$AGENTD_STACK_FILE`` when the agent asks (each message names that signal, so the agent
never sends it to a process that did not register it). A worker that heartbeated enters
the section :data:`SHUTDOWN_SECTION` when its interpreter exits, so the time torch and
NCCL take to tear down is held to that section's timeout, not the step's. Nothing here
needs torch or asyncio.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from time import monotonic, monotonic_ns
from types import TracebackType
from typing import IO

from agentd.drain.client import new_attempt as _drain_new_attempt
from agentd.drain.client import tick as _drain_tick
from agentd.wire.progress import (
    DUMP_SIGNAL_ENV,
    PIPE_ENV,
    STACK_FILE_ENV,
    check_section_name,
    encode,
)

SEND_INTERVAL = 0.25
"""Seconds between two heartbeat messages at most; the agent needs no more."""
_SEND_INTERVAL_NS = int(SEND_INTERVAL * 1e9)
_NEVER = 1 << 62
SHUTDOWN_SECTION = "shutdown"
"""The section a worker is in from its interpreter's exit on (``atexit``): held to that
section's timeout (``--initial-heartbeat-timeout`` until it has samples, or
``--section-timeout shutdown=S``), as the step's would take the teardown for a hang."""

_steps = 0
_next_send_ns = 0
"""When a heartbeat must send next (monotonic ns); _NEVER once we know there is no agent."""


class _Channel:
    """The write end of the agent's pipe, held open, for one process."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.dump_signal = 0
        self._stack_file: IO[str] | None = None

    def register_dumps(self) -> None:
        """Dump every thread's stack to the agent's file on its signal (if it gave both):
        the attempt's file, again at each in-process restart."""
        import faulthandler

        try:
            sig = int(os.environ.get(DUMP_SIGNAL_ENV) or 0)
        except ValueError:
            return
        path = os.environ.get(STACK_FILE_ENV)
        if not sig or not path:
            return
        before = self._stack_file
        try:
            self._stack_file = open(path, "a")  # noqa: SIM115 (faulthandler keeps writing it)
            faulthandler.register(sig, file=self._stack_file, all_threads=True)
        except (OSError, ValueError, RuntimeError) as exc:
            _warn(f"stack dumps are off ({exc})")
            return
        if before is not None:
            before.close()
        self.dump_signal = sig

    def send(self, kind: str, section: str | None = None) -> None:
        # Every message says how to ask for a dump: any one of them may be the first the
        # agent reads (it drops what comes before it knows the worker).
        data = encode(kind, os.getpid(), _steps, monotonic(), section, self.dump_signal)
        with contextlib.suppress(BlockingIOError):  # the agent is behind: the next one tells
            os.write(self.fd, data)  # at most PIPE_BUF bytes: atomic


_channel: _Channel | None = None


def _open_channel() -> _Channel | None:
    """Open the channel to the agent (first use); None, for good, without one."""
    global _channel, _next_send_ns
    path = os.environ.get(PIPE_ENV)
    if not path:
        _next_send_ns = _NEVER
        return None
    try:
        _channel = _Channel(path)
    except OSError as exc:
        _warn(f"cannot reach the agent at {path} ({exc.strerror}); heartbeats are off")
        _next_send_ns = _NEVER
        return None
    _channel.register_dumps()
    atexit.register(_enter_shutdown, os.getpid())
    return _channel


def _enter_shutdown(pid: int) -> None:
    """At interpreter exit: the worker is in its teardown (not in a child forked since)."""
    if os.getpid() == pid and _next_send_ns != _NEVER:
        _send("enter", SHUTDOWN_SECTION)


def _send(kind: str, section: str | None = None) -> None:
    global _channel, _next_send_ns
    channel = _channel or _open_channel()
    if channel is None:
        return
    try:
        channel.send(kind, section)
    except OSError as exc:  # the agent is gone (EPIPE): its workers are about to be too
        _warn(f"lost the agent's pipe ({exc.strerror}); heartbeats are off")
        with contextlib.suppress(OSError):
            os.close(channel.fd)
        _channel, _next_send_ns = None, _NEVER
        return
    _next_send_ns = monotonic_ns() + _SEND_INTERVAL_NS


def _warn(text: str) -> None:
    sys.stderr.write(f"agentd.heartbeats.client: {text}\n")
    sys.stderr.flush()


def heartbeat() -> None:
    """One step of progress: call it once per training step, on every rank.

    Costs well under two microseconds when nothing must be sent; a no-op without agentd.
    """
    global _steps
    _steps += 1
    if monotonic_ns() >= _next_send_ns:
        _send("beat")
    _drain_tick(_steps, _send)  # a drain asks every rank to checkpoint at the same step


def new_attempt() -> None:
    """The job restarted in this process (``agentd.inprocess.run``): count this attempt's
    steps from 0, as a new process does. Every rank of the attempt then reports the same
    step to a drain, whether it kept its process or not (a kept rank's count ran on from
    the last attempt, and the drain's step was out of the new ranks' reach). Its stack
    dumps go to the new attempt's file, where the agent reads them."""
    global _steps
    _steps = 0
    _drain_new_attempt()
    if _channel is not None:
        _channel.register_dumps()  # to the new attempt's stack file, which the agent reads


def end_heartbeats() -> None:
    """This worker will heartbeat no more for now (training is over): the agent stops
    watching it for hangs until its next heartbeat or section."""
    if _next_send_ns != _NEVER:
        _send("done")


def parked() -> None:
    """This worker parked in an in-process restart (:mod:`agentd.inprocess`): silent by
    design until it resumes, so the agent holds it to no timeout meanwhile, and a hang
    found during the park is one of the ranks that did not park. Sent only by a worker
    that heartbeats (one that never did is held to no timeout anyway)."""
    if _channel is not None:
        _send("parked")


class section(contextlib.ContextDecorator):
    """``with section("checkpoint"):`` marks a phase with a timeout of its own.

    While a worker is inside a section, the agent holds it to that section's timeout
    (learned from the section's past durations, or ``--section-timeout NAME=S``) instead
    of the step's. Sections nest; the innermost one counts. Also a decorator.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = check_section_name(name)

    def __enter__(self) -> section:
        if _next_send_ns != _NEVER:
            _send("enter", self.name)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if _next_send_ns != _NEVER:
            _send("exit", self.name)
