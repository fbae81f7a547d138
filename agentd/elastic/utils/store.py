"""``torch.distributed.elastic.utils.store``: helpers over a torch ``Store`` (``set``,
``get``, ``add``, ``multi_get``), for code that shares one between ranks.

agentd's own agents meet through their rendezvous (their exit barrier is
``rdzv_handler.exit_barrier()``); these are for users' stores.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["barrier", "get_all", "synchronize"]


def get_all(store: Any, rank: int, prefix: str, world_size: int) -> list[bytes]:
    """Every rank's value under ``prefix<rank>``, by rank (waits for each)."""
    keys = [f"{prefix}{r}" for r in range(world_size)]
    if hasattr(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(key) for key in keys]


def synchronize(
    store: Any, data: bytes, rank: int, world_size: int, key_prefix: str, timeout: float = 300
) -> list[bytes]:
    """Publish ``data`` as this rank's and return every rank's, once all have published."""
    store.set_timeout(timedelta(seconds=timeout))
    store.set(f"{key_prefix}{rank}", data)
    return get_all(store, rank, key_prefix, world_size)


def barrier(store: Any, world_size: int, key_prefix: str, barrier_timeout: float = 300,
            rank: int | None = None, **_: Any) -> None:  # fmt: skip
    """Return once ``world_size`` callers reached it (the store raises after the timeout)."""
    store.set_timeout(timedelta(seconds=barrier_timeout))
    arrived = store.add(f"{key_prefix}/num_members", 1)
    done = f"{key_prefix}/last_member"
    if arrived == world_size:
        store.set(done, "<done>")
    store.get(done)
