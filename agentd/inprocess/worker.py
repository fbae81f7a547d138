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
the same process, with whatever objects the caller kept. Outside agentd (no channel)
:func:`run` is a plain call.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentd.inprocess import wire

log = logging.getLogger(__name__)

T = TypeVar("T")


class Interrupted(BaseException):
    """Raised in the training function when the agent restarts the job in process."""


@dataclass(frozen=True)
class Restart:
    """Where this process stands: ``count`` in-process restarts so far; ``replaced`` the
    global ranks that are new processes in this attempt (their state comes from
    ``source``, a rank that kept its process); both empty on a fresh start."""

    count: int = 0
    replaced: tuple[int, ...] = ()
    source: int | None = None


def _from_env(count: int) -> Restart:
    replaced = tuple(int(r) for r in os.environ.get(wire.REPLACED_ENV, "").split(",") if r)
    source = os.environ.get(wire.SOURCE_ENV)
    return Restart(count, replaced, int(source) if source and replaced else None)


_current = Restart()


def current() -> Restart:
    """This process's :class:`Restart` (read it inside the training function)."""
    return _current


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
                        if self._armed:
                            self._armed = False
                            _async_raise(self._main, Interrupted)
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


def _destroy_process_group() -> None:
    """Destroy every process group, so the next call can initialise again, and abort them
    on a thread of their own (the GIL is released there), so the restart waits for neither:
    the abort closes their connections (20-30 ms for gloo), so a peer still blocked in a
    collective with this rank fails at once and can park too, and the teardown that
    follows never waits for that collective."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            world = getattr(dist.distributed_c10d, "_world", None)
            doomed = [dist.group.WORLD, *getattr(world, "pg_map", {})]
            dist.destroy_process_group()
            threading.Thread(target=_abort, args=(doomed,), name="agentd-pg-abort",
                             daemon=True).start()  # fmt: skip


def _abort(groups: list[Any]) -> None:
    for group in groups:
        with contextlib.suppress(Exception):
            group.abort()
    groups.clear()


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` and return its result; under agentd, call it again in
    this process each time the agent restarts the job (see the module docstring)."""
    global _current
    channel = _open_channel()
    _current = _from_env(_current.count)
    if channel is None:
        return fn(*args, **kwargs)
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
        _destroy_process_group()
        channel.send("parked")
        channel.resumed.wait()
        if channel.closed.is_set():
            raise SystemExit(1)  # the agent is gone; it stops us anyway
        os.environ.update(channel.env)
        _current = _from_env(_current.count + 1)
        log.info("agentd: restarting in process (restart %d, rank %s of %s)", _current.count,
                 os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))  # fmt: skip
