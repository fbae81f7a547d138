"""A write under a lease of its own, granted again where it lapsed before the write arrived.

A TTL on etcd is a lease: granted first, then named by the write. A client or an etcd that
stalls a TTL long between the two (a loaded machine, a paused VM, a frozen agent) finds
the lease gone, and etcd refuses the write whole ("requested lease not found"). Nothing
was written, so the write is sent again under a new lease; the caller, which counts its
TTL from before the first grant, only ever holds the key longer than it thinks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentd.store.api import StoreUnavailable
from agentd.store.etcd.gateway import EtcdGateway, LeaseLapsed

log = logging.getLogger(__name__)

LEASE_TRIES = 3
"""Leases granted for one write, each lapsed before the write arrived, before it fails."""

T = TypeVar("T")


async def leased(
    gateway: EtcdGateway, ttl: float | None, write: Callable[[str | None], Awaitable[T]]
) -> T:
    """``write(lease)`` under a new lease of ``ttl`` seconds (rounded up; etcd may raise it
    to its minimum), or ``write(None)`` without a TTL. A lease that lapsed before its write
    arrived is granted anew, :data:`LEASE_TRIES` times in all; then StoreUnavailable."""
    if ttl is None:
        return await write(None)
    for _ in range(LEASE_TRIES):
        grant = {"TTL": max(1, math.ceil(ttl))}
        lease = str((await gateway.post("lease_grant", "/v3/lease/grant", grant))["ID"])
        try:
            return await write(lease)
        except LeaseLapsed as exc:
            log.warning("%s; sending it again under a new lease (the last lapsed first)", exc)
    raise StoreUnavailable(
        f"etcd at {gateway.where}: {LEASE_TRIES} leases of {ttl:g}s lapsed, each before its "
        "write arrived: the client or etcd stalls longer than the TTL"
    )
