"""The worker's side of an in-process restart (see :mod:`agentd.inprocess`).

:func:`run` calls the training function. When the agent restarts the job (a rank died,
hung or was reaped, or the membership changed), it sends ``park``: a reader thread raises
:class:`Interrupted` in the main thread while the training function runs (a collective
blocked in native code returns first: gloo fails it as soon as a peer's socket closes).
An exception that reaches :func:`run` while no ``park`` came is a failure of this rank,
as under torchrun, but its process may be kept: the worker tells the agent (``error``),
which restarts the job at once (a restart is spent) and parks it with the others. A
peer's death is often seen first by the survivors' collectives, on another node too.
The worker waits up to ``AGENTD_INPROCESS_GRACE`` seconds for its ``park`` (the agent
sets it); without one the exception propagates as usual and the process exits.
Parked, the worker destroys its torch process group, tells the agent, waits for
``resume`` with the new attempt's variables, and calls the training function again in
the same process, with whatever objects the caller kept. Without a channel (outside
agentd, or under an agent whose group is never restarted) :func:`run` is a plain call
that writes an exception it raises to the error file, as ``@record`` does, so the failure
report names it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentd.heartbeats.client import new_attempt
from agentd.heartbeats.client import parked as say_parked
from agentd.inprocess import wire
from agentd.inprocess.teardown import abort_nccl, destroy_process_groups

log = logging.getLogger(__name__)

T = TypeVar("T")


class Interrupted(BaseException):
    """Raised in the training function when the agent restarts the job in process."""


@dataclass(frozen=True)
class Restart:
    """Where this process stands: ``count`` in-process restarts so far; ``replaced`` the
    global ranks that are new processes in this attempt (their state comes from
    ``source``, a rank that kept its process); both empty on a fresh start. As the agent
    planned them until the attempt's first ``sync()``, then as the ranks agreed on them
    (:mod:`agentd.inprocess.holders`). ``fresh``: no rank of this attempt holds the job's
    state (the first attempt, or a restart that used new processes for every rank): load
    the checkpoint.
    ``teardown_s``: seconds this process spent, at its last park, tearing its process
    groups down (a gloo group's destruction; for NCCL groups, forgetting them, their
    abort going on in the background, or the abort itself under
    ``AGENTD_INPROCESS_NCCL_ABORT=wait``); 0.0 before any. ``round``: the attempt's
    rendezvous round, the same on every rank."""

    count: int = 0
    replaced: tuple[int, ...] = ()
    source: int | None = None
    fresh: bool = True
    teardown_s: float = 0.0
    round: int = 0


def _from_env(count: int, teardown_s: float = 0.0) -> Restart:
    replaced = tuple(int(r) for r in os.environ.get(wire.REPLACED_ENV, "").split(",") if r)
    source = os.environ.get(wire.SOURCE_ENV)
    fresh = os.environ.get(wire.FRESH_ENV, "1") != "0"
    known = int(source) if source and replaced else None
    round_ = int(os.environ.get(wire.ROUND_ENV) or 0)
    return Restart(count, replaced, known, fresh, teardown_s, round_)


_current = Restart()
_stale = False
"""This process was resumed as stale (:data:`~agentd.inprocess.wire.STALE_ENV`: its node
missed a round) and has not held the job's state since: what it holds is older than the
job's, in every attempt until it syncs again (a round that re-forms before the sync, as
one that takes the next node in, must not make it a holder again)."""


def stale() -> bool:
    """Whether the state this process holds is older than the job's (see :data:`_stale`)."""
    return _stale


def synced() -> None:
    """This process holds the job's state of its attempt now (it is no longer stale)."""
    global _stale
    _stale = False


def current() -> Restart:
    """This process's :class:`Restart` (read it inside the training function)."""
    return _current


def agree(restart: Restart) -> None:
    """This attempt's :class:`Restart` as the ranks agreed on it (see
    :mod:`agentd.inprocess.holders`): what :func:`current` returns until the next one."""
    global _current
    _current = restart


class _Channel:
    """The worker's end: a reader thread that turns ``park`` into :class:`Interrupted`."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._lock = threading.Lock()
        self._main = threading.main_thread().ident or 0
        self._armed = False
        self.parking = threading.Event()
        self.resumed = threading.Event()
        self.closed = threading.Event()
        self.env: dict[str, str] = {}
        threading.Thread(target=self._read, name="agentd-inprocess", daemon=True).start()

    def send(self, op: str, **fields: Any) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(wire.encode(op, **fields))

    def arm(self, armed: bool) -> None:
        """Let a ``park`` interrupt the main thread (only while the training function runs);
        disarming drops an interruption not yet delivered."""
        with self._lock:
            self._armed = armed
            if not armed:
                _async_raise(self._main, None)

    def _read(self) -> None:
        with self._sock.makefile("rb") as stream:
            for line in stream:
                try:
                    message = wire.decode(line, wire.AGENT_OPS)
                except wire.ProtocolError as exc:
                    log.error("agentd in-process channel: %s; ignored", exc)
                    continue
                if message["op"] == "park":
                    self.resumed.clear()
                    self.parking.set()
                    with self._lock:
                        interrupt, self._armed = self._armed, False
                        if interrupt:
                            _async_raise(self._main, Interrupted)
                    if interrupt:  # a main thread blocked in an NCCL wait returns, then raises
                        abort_nccl()
                else:
                    self.env = message.get("env", {})
                    self.parking.clear()
                    self.resumed.set()
        self.closed.set()
        self.parking.clear()
        self.resumed.set()  # a parked worker must not wait for an agent that is gone


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


_channel: _Channel | None = None


def _open_channel() -> _Channel | None:
    global _channel
    if _channel is None:
        fd = os.environ.get(wire.CHANNEL_FD_ENV, "")
        if not fd.isdigit():
            return None
        try:
            _channel = _Channel(int(fd))
        except OSError:
            return None
        _channel.send("hello")
    return _channel


def _grace() -> float:
    try:
        return max(0.0, float(os.environ.get(wire.GRACE_ENV, wire.DEFAULT_GRACE)))
    except ValueError:
        return wire.DEFAULT_GRACE


def _no_channel_warning() -> None:
    """Under agentd, a worker without a channel restarts as a new process: say why."""
    if os.environ.get("AGENTD_RELEASE_FDS"):
        log.warning(
            "agentd.inprocess.run: function entrypoints restart as new processes, "
            "not in process (run a script to restart in process)"
        )
    elif os.environ.get(wire.CHANNEL_FD_ENV):
        log.warning(
            "agentd.inprocess.run: descriptor %s (%s) is not this worker's in-process "
            "channel: its restarts use new processes",
            os.environ[wire.CHANNEL_FD_ENV],
            wire.CHANNEL_FD_ENV,
        )


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` and return its result; under agentd, call it again in
    this process each time the agent restarts the job (see the module docstring)."""
    global _current, _stale
    channel = _open_channel()
    _current = _from_env(_current.count, _current.teardown_s)
    if channel is None:
        _no_channel_warning()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the failure's cause, as a channel would have told it
            from agentd.errors.error_file import write_error_file

            write_error_file(exc)  # nothing without $TORCHELASTIC_ERROR_FILE
            raise
    while True:
        try:
            try:
                channel.arm(True)
                return fn(*args, **kwargs)
            finally:
                channel.arm(False)
        except Interrupted:
            pass
        except Exception as exc:
            if not channel.parking.is_set():  # a failure: the agent restarts the job at once
                channel.send("error", message=f"{type(exc).__name__}: {exc}"[: wire.MAX_MESSAGE])
            if not channel.parking.wait(_grace()) or channel.closed.is_set():
                raise
        began = time.perf_counter()
        try:
            destroy_process_groups()
        except Exception:
            log.error(
                "agentd.inprocess.run: the process group could not be destroyed; "
                "this rank restarts as a new process"
            )
            raise
        teardown_s = time.perf_counter() - began
        say_parked()  # no hang now: a hang found during the park is a rank that did not park
        channel.send("parked")
        channel.resumed.wait()
        if channel.closed.is_set():
            raise SystemExit(1)  # the agent is gone; it stops us anyway
        os.environ.update(channel.env)
        _current = _from_env(_current.count + 1, teardown_s)
        _stale = _stale or os.environ.get(wire.STALE_ENV) == "1"
        new_attempt()  # its steps count from 0 on every rank, kept or new
        log.info(
            "agentd: restarting in process (restart %d, rank %s of %s; process groups "
            "torn down in %.1f ms)",
            _current.count,
            os.environ.get("RANK"),
            os.environ.get("WORLD_SIZE"),
            teardown_s * 1000,
        )
