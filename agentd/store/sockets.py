"""Client sockets whose connections cannot hang on a dead peer.

A long poll waits on an idle connection for up to a minute. If the network between the
agent and the store fails silently (a partition, a host lost without a reset), nothing
ever arrives and the poll would sit there until its timeout. TCP keepalive probes an idle
connection every second after a second of silence and gives up after two unanswered
probes; ``TCP_USER_TIMEOUT`` gives up on data left unacknowledged for three seconds. So a
connection to a peer that cannot be reached fails within about :data:`LIVENESS` seconds,
and the request is retried on a new one, without any extra request while all is well.

The same bound is a proof: a request still waiting after :data:`DELIVERED_AFTER` seconds
on a connection that has not failed was acknowledged by the peer's host.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

KEEPIDLE, KEEPINTVL, KEEPCNT = 1, 1, 2
USER_TIMEOUT_MS = 3000
LIVENESS = KEEPIDLE + KEEPINTVL * KEEPCNT
"""Seconds, about, for a connection to a vanished peer to fail."""
DELIVERED_AFTER = USER_TIMEOUT_MS / 1000 + 0.5
"""Seconds after which a request still waiting, its connection alive, was delivered."""
_refused: set[str] = set()
"""The options this host refused, each said once."""


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A socket for aiohttp's ``TCPConnector(socket_factory=...)`` with the probes above."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPIDLE),
        ("TCP_KEEPINTVL", KEEPINTVL),
        ("TCP_KEEPCNT", KEEPCNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        if hasattr(socket, option):  # Linux has them all; elsewhere, what there is
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
            except OSError as exc:
                if option not in _refused:
                    _refused.add(option)
                    log.warning(
                        "Store connections: %s=%s refused (%s); a connection to a store "
                        "host that vanished may hang past %.1fs",
                        option,
                        value,
                        exc.strerror or exc,
                        LIVENESS,
                    )
    return sock
