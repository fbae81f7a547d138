"""A parked worker's process groups, torn down so that the next call of the training
function can initialise again (see :mod:`agentd.inprocess.worker`): NCCL communicators
aborted, so that a wait on one returns instead of waiting for a peer that is gone; every
group destroyed or aborted, never destroyed unaborted where one runs on NCCL."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any

from agentd.inprocess import wire
from agentd.support.compat.torch import (
    abort_groups,
    abort_process_groups,
    forget_process_groups,
    group_backend,
    process_groups,
    reset_group_names,
)

log = logging.getLogger(__name__)


def _uses_nccl(dist: Any, group: Any) -> bool:
    """Whether ``group`` runs any collective on NCCL, by its backend's name."""
    try:
        return "nccl" in str(dist.get_backend(group)).lower()
    except Exception:  # a group torch no longer knows: nothing of it to abort
        return False


def _nccl_groups(dist: Any) -> list[Any]:
    """The NCCL backends of this process's groups (none without CUDA or NCCL). An NCCL
    group whose backend cannot be had is named in a WARNING: it cannot be aborted alone
    (:func:`destroy_process_groups` still aborts it, with every group)."""
    torch = sys.modules.get("torch")
    if torch is None or not dist.is_nccl_available():
        return []
    backends = []
    for group in {g for g in process_groups(dist) if g is not None}:
        if not _uses_nccl(dist, group):
            continue
        try:
            backend = group_backend(group, torch.device("cuda"))
        except Exception as exc:
            log.warning(
                "In-process restart: the NCCL backend of process group %r cannot be had "
                "(%s: %s); it is aborted with every other group",
                group,
                type(exc).__name__,
                exc,
            )
            continue
        if isinstance(backend, dist.ProcessGroupNCCL):
            backends.append(backend)
    return backends


def abort_nccl() -> None:
    """Abort every NCCL communicator of this process, so that a collective or a wait
    blocked on one returns (with an error) instead of waiting for a peer that is gone."""
    dist = sys.modules.get("torch.distributed")
    with contextlib.suppress(Exception):
        if dist is not None and dist.is_available() and dist.is_initialized():
            for backend in _nccl_groups(dist):
                with contextlib.suppress(Exception):
                    backend.abort()


def destroy_process_groups() -> None:
    """Destroy every process group, so the next call can initialise again. Where any
    group runs on NCCL, every group is aborted, never destroyed (which can wait for a peer
    that is gone): torch forgets them at once and a thread aborts them (every communicator
    and its GPU buffers go; NCCL 2.28 takes 0.5-1 s for it, which the restart does not
    wait for), or, under ``AGENTD_INPROCESS_NCCL_ABORT=wait``, the park aborts them
    (torch's ``_abort_process_group``). At most one attempt's groups are aborting at a
    time: a park waits for the last one's abort first. Gloo groups are destroyed, then
    aborted on a thread of their own (the GIL is released there), so the restart waits
    for neither: the abort closes their connections (20-30 ms for gloo), so a peer still
    blocked in a collective with this rank fails at once and can park too, and the
    teardown that follows never waits for that collective.

    Raises what torch raised when a group cannot be destroyed: a worker that kept a live
    group must not be resumed (it exits, and a new process takes its rank)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return
    if not dist.is_initialized():
        _forget_unfinished_init(dist)
        return
    if any(_uses_nccl(dist, g) for g in process_groups(dist) if g is not None):
        _abort_nccl_groups(dist)  # by the backend's name: never destroyed unaborted
        return
    doomed = process_groups(dist)
    dist.destroy_process_group()
    threading.Thread(target=_abort, args=(doomed,), name="agentd-pg-abort", daemon=True).start()


_aborting: threading.Thread | None = None


def _nccl_abort_waits() -> bool:
    """Whether ``AGENTD_INPROCESS_NCCL_ABORT`` asks the park to wait for NCCL's abort; a
    value that is neither mode is named in a WARNING, and the default kept."""
    mode = os.environ.get(wire.NCCL_ABORT_ENV, "background").strip().lower() or "background"
    if mode not in wire.NCCL_ABORT_MODES:
        log.warning(
            "agentd.inprocess.run: %s=%r is not one of %s; NCCL groups are aborted in "
            "the background",
            wire.NCCL_ABORT_ENV,
            os.environ[wire.NCCL_ABORT_ENV],
            ", ".join(wire.NCCL_ABORT_MODES),
        )
    return mode == "wait"


def _abort_nccl_groups(dist: Any) -> None:
    """Abort every group of a process that runs any on NCCL (see
    :func:`destroy_process_groups`)."""
    global _aborting
    if _aborting is not None:
        _aborting.join()  # one attempt's communicators at most beside the next one's
        _aborting = None
    torch = sys.modules.get("torch")
    nccl = None
    with contextlib.suppress(Exception):
        backend = group_backend(dist.group.WORLD, torch.device("cuda"))  # type: ignore[union-attr]
        nccl = backend if isinstance(backend, dist.ProcessGroupNCCL) else None
    doomed = [] if _nccl_abort_waits() else forget_process_groups(dist)
    if not doomed:
        abort_process_groups(dist)
        return
    _aborting = threading.Thread(
        target=_abort_in_background, args=(doomed, nccl), name="agentd-nccl-abort", daemon=True
    )
    _aborting.start()


def _abort_in_background(groups: list[Any], nccl: Any | None) -> None:
    began = time.perf_counter()
    try:
        abort_groups(groups, nccl)
    except Exception as exc:
        log.warning(
            "agentd.inprocess.run: the last attempt's process groups could not all be "
            "aborted (%s: %s); their communicators are freed when this process exits",
            type(exc).__name__,
            exc,
        )
    else:
        log.info(
            "agentd: the last attempt's process groups aborted in the background in %.0f ms",
            (time.perf_counter() - began) * 1000,
        )
    finally:
        groups.clear()


def _forget_unfinished_init(dist: Any) -> None:
    """An ``init_process_group`` interrupted (or failed) before it made the default group
    named it all the same: torch counts the names it gives (``_world.group_count``), and
    only ``destroy_process_group`` resets the count, which it cannot do without a default
    group. Left, this rank's next group was named "1" and its store keys never met a new
    rank's "0" (``bench/bench_chaos.py --inprocess``, seed 0: every rank of the round
    waited out its 60 s timeout)."""
    with contextlib.suppress(Exception):  # a torch without the count has nothing to reset
        reset_group_names(dist)


def _abort(groups: list[Any]) -> None:
    with contextlib.suppress(Exception):  # gloo: a group that cannot abort is gone anyway
        abort_groups(groups, None)
    groups.clear()
