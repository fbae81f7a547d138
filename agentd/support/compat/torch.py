"""torch.distributed's private parts: the process groups of this process, a group's
backend, aborting every group (or forgetting them, to abort them apart), the count of the
groups' names, and a ``LogsSpecs``' settings (torch 2.x; checked on 2.11 and 2.13)."""

from __future__ import annotations

from typing import Any


def process_groups(dist: Any) -> list[Any]:
    """The default group and every group created since (``distributed_c10d._world.pg_map``:
    torch lists them nowhere public)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    return [dist.group.WORLD, *getattr(world, "pg_map", {})]


def group_backend(group: Any, device: Any) -> Any:
    """The backend ``group`` runs collectives on ``device`` with (``_get_backend``)."""
    return group._get_backend(device)


def abort_process_groups(dist: Any) -> None:
    """Abort every process group: communicators and buffers go, nothing waits for a peer
    (``distributed_c10d._abort_process_group``)."""
    dist.distributed_c10d._abort_process_group()


WORLD_TABLES = (
    "pg_map",
    "pg_names",
    "pg_group_ranks",
    "pg_backend_config",
    "pg_to_tag",
    "tags_to_pg",
    "pg_coalesce_state",
)
"""What torch's ``distributed_c10d._world`` keeps of each process group."""


def forget_process_groups(dist: Any) -> list[Any]:
    """Make torch forget every process group as ``_abort_process_group`` does (no default
    group, no names, the name count back at "0"), without aborting them: the groups, the
    newest first, are returned for :func:`abort_groups`. Nothing is forgotten, and the
    list is empty, where torch keeps its groups elsewhere than this code knows."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    helpers = ("_update_default_pg", "_unregister_all_process_groups")
    if world is None or not all(hasattr(world, t) for t in WORLD_TABLES):
        return []
    if not all(hasattr(c10d, h) for h in helpers):
        return []
    groups = sorted(world.pg_names, key=lambda group: world.pg_names[group], reverse=True)
    c10d._update_default_pg(None)
    for table in WORLD_TABLES:
        getattr(world, table).clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0
    return groups


def abort_groups(groups: list[Any], nccl: Any | None) -> None:
    """Abort ``groups`` (from :func:`forget_process_groups`), within one NCCL group call
    where ``nccl`` (an NCCL backend) is given: communicators' aborts then cannot deadlock
    each other (torch's ``_abort_process_group`` does the same). A group whose abort raises
    does not keep the others from theirs: the first error is raised once all were tried."""
    failed: Exception | None = None
    if nccl is not None:
        nccl._group_start()
    try:
        for group in groups:
            try:
                group.abort()
            except Exception as exc:
                failed = failed or exc
    finally:
        if nccl is not None:
            nccl._group_end()
    if failed is not None:
        raise failed


def reset_group_names(dist: Any) -> None:
    """Name the next group as a new process names its first: "0" (torch counts the names
    it gives in ``distributed_c10d._world.group_count``; only ``destroy_process_group``
    resets it, and only where a default group was made)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None:
        world.group_count = 0


def logs_specs_settings(specs: Any) -> tuple[Any, Any, Any]:
    """``(redirects, tee, local_ranks_filter)`` of torch's ``LogsSpecs`` (or a subclass),
    which keeps them as ``_redirects``, ``_tee`` and ``_local_ranks_filter`` only. A
    subclass that set none of them has the defaults (nothing redirected, every rank)."""
    return (
        getattr(specs, "_redirects", 0),
        getattr(specs, "_tee", 0),
        getattr(specs, "_local_ranks_filter", None),
    )
