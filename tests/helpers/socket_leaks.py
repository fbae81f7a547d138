"""A pytest plugin: a test that leaves an asyncio socket open after its event loop closed
fails itself, naming the peer and where the socket was opened; a socket or stream writer
collected unclosed while its loop runs warns with where the socket was opened, and so does
a bare socket that never had a transport (a connect given up, say).

Without it, such a socket is found later by the garbage collector, in whichever test a
full collection happens to run, as an unraisable ResourceWarning that
``filterwarnings = error`` turns into a failure of an unrelated test (CI once failed a
``--preload`` test for a socket left by a store test, one suite in six).
"""

from __future__ import annotations

import functools
import socket
import sys
import traceback
import warnings
import weakref
from asyncio import selector_events, streams
from collections.abc import Iterator
from typing import Any

import pytest

_transports: weakref.WeakSet[Any] = weakref.WeakSet()


def _tracked(init: Any) -> Any:
    @functools.wraps(init)
    def track(self: Any, loop: Any, sock: Any, *args: Any, **kwargs: Any) -> None:
        self._opened_at = traceback.format_stack(limit=16)[:-1]  # before: init may fail
        try:
            init(self, loop, sock, *args, **kwargs)
        except BaseException:
            # Python 3.11's server, closed as it accepts a connection, fails the new
            # transport's init (Server._attach asserts it is open) with the socket still
            # open: a later collection would blame a random test for it. Close it now.
            sock.close()
            self._sock = None  # closed: its collection has nothing to say
            raise
        _transports.add(self)

    return track


selector_events._SelectorSocketTransport.__init__ = _tracked(  # type: ignore[method-assign]
    selector_events._SelectorSocketTransport.__init__
)


_collected = selector_events._SelectorTransport.__del__


def _warn_with_origin(self: Any, _warn: Any = warnings.warn) -> None:
    """A transport collected with its socket open: the warning names where it was opened
    (the collection runs in whichever test it happens to, not the one that leaked it)."""
    opened_at = getattr(self, "_opened_at", None)
    if self._sock is None or opened_at is None:
        _collected(self)
        return
    _warn(
        f"unclosed transport {self!r}, opened at:\n{''.join(opened_at)}",
        ResourceWarning,
        source=self,
    )
    self._sock.close()


selector_events._SelectorTransport.__del__ = _warn_with_origin  # type: ignore[method-assign]


_writer_collected = getattr(streams.StreamWriter, "__del__", None)  # (not in every 3.11)


def _writer_warn_with_origin(self: Any, _warn: Any = warnings.warn) -> None:
    """A stream writer collected while its loop runs and its transport is open (nobody
    closed it): the warning names where its socket was opened, which asyncio's own does
    not (CI once failed a test on 'unclosed <StreamWriter ...>' with no clue)."""
    opened_at = getattr(self._transport, "_opened_at", None)
    if self._transport.is_closing() or self._loop.is_closed() or opened_at is None:
        assert _writer_collected is not None
        _writer_collected(self)
        return
    self.close()
    _warn(
        f"unclosed {self!r}, its socket opened at:\n{''.join(opened_at)}",
        ResourceWarning,
        source=self,
    )


if _writer_collected is not None:
    streams.StreamWriter.__del__ = _writer_warn_with_origin  # type: ignore[method-assign]


_created_at: dict[int, tuple[tuple[str, int, str], ...]] = {}
"""Where the socket now holding each descriptor was made (file, line, function), newest
first. A socket collected unclosed still holds its descriptor, so its entry is its own."""
_socket_init = socket.socket.__init__


def _recorded(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _socket_init(self, *args, **kwargs)
    frames, frame = [], sys._getframe(1)
    while frame is not None and len(frames) < 14:  # cheap: every socket of the suite
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    _created_at[self.fileno()] = tuple(frames)


socket.socket.__init__ = _recorded  # type: ignore[method-assign]


def socket_origin(sock: object) -> str | None:
    """Where the unclosed ``sock`` was made, as a stack (None: not a socket, or closed)."""
    if not isinstance(sock, socket.socket) or sock.fileno() < 0:
        return None
    frames = _created_at.get(sock.fileno())
    if frames is None:
        return None
    return "".join(f'  File "{f}", line {n}, in {name}\n' for f, n, name in reversed(frames))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Wrap pytest's hook for unraisable exceptions (installed by its own configure,
    before this one): an unclosed socket's warning says where the socket was made."""
    inner = sys.unraisablehook

    def with_origin(unraisable: Any) -> None:
        origin = socket_origin(unraisable.object)
        if origin is not None and isinstance(unraisable.exc_value, ResourceWarning):
            said = unraisable.err_msg or "Exception ignored in"
            unraisable = type(unraisable)(
                (
                    unraisable.exc_type,
                    unraisable.exc_value,
                    unraisable.exc_traceback,
                    f"{said} (a socket made at:\n{origin}) ",
                    unraisable.object,
                )
            )
        inner(unraisable)

    sys.unraisablehook = with_origin


def left_open() -> list[Any]:
    """Socket transports whose loop is closed while their socket is not."""
    return [t for t in list(_transports) if t._sock is not None and t._loop.is_closed()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    leaked = left_open()
    if not leaked:
        return
    lines = []
    for transport in leaked:
        peer = transport.get_extra_info("peername")
        lines.append(f"{transport!r} to {peer}, opened at:\n{''.join(transport._opened_at)}")
        transport._sock.close()  # closed here, so no later test is blamed for it
        transport._sock = None
    pytest.fail(
        f"{item.nodeid} left {len(leaked)} socket(s) open after its event loop "
        f"closed:\n" + "\n".join(lines),
        pytrace=False,
    )
