"""``torch.distributed.elastic.utils.store``: helpers over a torch ``Store`` (``set``,
``get``, ``add``, ``wait``, ``multi_get``), for code that shares one between ranks.

Each helper sets the store's timeout for its own calls and puts the caller's back after,
even when it raises. The keys are torch's (``<prefix>/num_members``,
``<prefix>/last_member``, ``<prefix><rank>/TRACE``), so ranks of either implementation
meet on one store. agentd's own agents meet through their rendezvous (their exit barrier
is ``rdzv_handler.exit_barrier()``); these are for users' stores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

__all__ = ["barrier", "get_all", "store_timeout", "synchronize"]

MAX_TRACED_MISSING = 16
"""Missing ranks a timed-out barrier names at most (then it stops looking)."""


@contextlib.contextmanager
def store_timeout(store: Any, timeout: float) -> Iterator[None]:
    """``store``'s timeout is ``timeout`` seconds inside the block, the caller's after."""
    previous = store.timeout
    store.set_timeout(timedelta(seconds=timeout))
    try:
        yield
    finally:
        store.set_timeout(previous)


def get_all(store: Any, rank: int, prefix: str, world_size: int) -> list[bytes]:
    """Every rank's value under ``prefix<rank>``, by rank (waits for each).

    Every rank calls it. Rank 0 returns only once every rank has read its values: rank 0
    often hosts the store, and its process ending first would fail the others' reads.
    """
    values = list(store.multi_get([f"{prefix}{r}" for r in range(world_size)]))
    everyone_read = _arrive(store, world_size, f"{prefix}/finished")
    if rank == 0:
        store.wait([everyone_read])
    return values


def synchronize(
    store: Any, data: bytes, rank: int, world_size: int, key_prefix: str, timeout: float = 300
) -> list[bytes]:
    """Publish ``data`` as this rank's and return every rank's, once all have published."""
    with store_timeout(store, timeout):
        store.set(f"{key_prefix}{rank}", data)
        return get_all(store, rank, key_prefix, world_size)


def barrier(
    store: Any,
    world_size: int,
    key_prefix: str,
    barrier_timeout: float = 300,
    rank: int | None = None,
    rank_tracing_decoder: Callable[[int], str] | None = None,
    trace_timeout: float = 10,
) -> None:
    """Return once ``world_size`` callers reached it; one ``key_prefix`` serves once.

    After ``barrier_timeout`` seconds the store's timeout error is raised. With ``rank``
    given, the ranks that did not arrive are looked for first: rank 0's error names them
    (through ``rank_tracing_decoder``, e.g. rank to host name; at most 16), the others'
    point to rank 0's.
    """
    if rank is None and rank_tracing_decoder is not None:
        raise ValueError("barrier: rank_tracing_decoder needs the caller's rank")
    with store_timeout(store, barrier_timeout):
        done = _arrive(store, world_size, key_prefix)
        try:
            store.wait([done])
        except Exception as exc:
            if rank is None or not _is_timeout(exc):
                raise
            decode = rank_tracing_decoder or str
            missing = _trace_missing(store, world_size, key_prefix, rank, decode, trace_timeout)
            if missing is None:  # rank 0 could not be heard either: the store's own error
                raise
            raise type(exc)(
                f"barrier {key_prefix!r}: rank {rank} timed out after {barrier_timeout:g}s "
                f"waiting for all {world_size}; missing_ranks=[{', '.join(missing)}]"
            ) from None


def _arrive(store: Any, world_size: int, key_prefix: str) -> str:
    """Count this caller in; the last of ``world_size`` sets the key returned to wait on."""
    if store.add(f"{key_prefix}/num_members", 1) == world_size:
        store.set(f"{key_prefix}/last_member", "<val_ignored>")
    return f"{key_prefix}/last_member"


def _trace_missing(
    store: Any,
    world_size: int,
    key_prefix: str,
    rank: int,
    decode: Callable[[int], str],
    trace_timeout: float,
) -> Iterable[str] | None:
    """After a barrier's timeout, every rank that is alive checks in; rank 0 lists those
    that do not (waiting ``trace_timeout`` for the first, 1 ms for each after a miss) and
    opens a gate. The others return a pointer to rank 0's list, or None without it."""
    store.set(f"{key_prefix}{rank}/TRACE", "<val_ignored>")
    gate = f"{key_prefix}/TRACING_GATE"
    if rank != 0:
        try:
            store.wait([gate])
        except Exception as exc:
            if _is_timeout(exc):
                return None
            raise
        return [f"<see rank 0 ({decode(0)}) for the missing ranks>"]
    missing: list[str] = []
    for other in range(1, world_size):
        if len(missing) >= MAX_TRACED_MISSING:
            break
        wait = timedelta(milliseconds=1) if missing else timedelta(seconds=trace_timeout)
        try:
            store.wait([f"{key_prefix}{other}/TRACE"], wait)
        except Exception as exc:
            if not _is_timeout(exc):
                raise
            missing.append(decode(other))
    store.set(gate, "<val_ignored>")
    return missing


def _is_timeout(exc: BaseException) -> bool:
    """``exc`` is a store's word that a wait ran out (torch's ``DistStoreError``, or any
    store's timeout)."""
    return isinstance(exc, TimeoutError) or type(exc).__name__ in {
        "DistStoreError",
        "StoreTimeout",
    }
