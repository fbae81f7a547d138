"""Floods of connections from the test process: idle ones, and slowloris ones that trickle
a request's headers. Sockets are non-blocking; nothing waits for a connect to finish."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator


def raise_own_fd_limit(wanted: int) -> int:
    """Let this process open ``wanted`` more descriptors; returns how many it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, max(soft, wanted + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target - 256


@contextlib.contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """Open ``count`` connections to 127.0.0.1:``port`` that never send a byte; closed on
    exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            socks.append(sock)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))  # refused or pending: either way, held
        yield socks
    finally:
        for sock in socks:
            sock.close()


def slowloris(port: int, count: int, seconds: float) -> None:
    """``count`` connections that send a request's headers one byte every 0.5 s."""
    request = b"POST /v1/get HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    socks = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    deadline = time.monotonic() + seconds
    sent = 0
    try:
        while time.monotonic() < deadline and sent < len(request):
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(request[sent : sent + 1])
            sent += 1
            time.sleep(0.5)
    finally:
        for sock in socks:
            sock.close()
