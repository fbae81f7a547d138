"""torch.distributed's private parts: the process groups of this process, a group's
backend, aborting every group, the count of the groups' names, and a ``LogsSpecs``'
settings (torch 2.x; checked on 2.11 and 2.13)."""

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
