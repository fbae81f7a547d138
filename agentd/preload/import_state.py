"""What a preloaded library fixed at import from the zygote's process, made each worker's.

A spawned worker imports its libraries with its own environment and streams; a forked one
inherits the zygote's import, made before any worker's variables existed. Two kinds of
import-time state would then differ, and each is handled here:

- **The environment read at import.** :func:`environment_reads` records the variables
  the preload read; :func:`unshared_reads` names those a worker sets for itself
  (:data:`WORKER_VARIABLES`) that no re-derivation below covers. The zygote reports them
  with its ``ready``, and ``--preload auto`` then spawns the workers instead of forking
  them (an explicit ``--preload`` is warned about and kept).
- **What each worker re-derives** (:func:`rederive`, in the forked child once its
  environment and streams are its own): Lightning's ``rank_zero_only.rank``, which it
  reads from ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` or ``JSM_NAMESPACE_RANK`` at
  import (0 in the zygote, whatever the worker's rank), and every ``logging`` stream
  handler made at import for ``sys.stdout`` or ``sys.stderr`` (Lightning's loggers have
  one), moved to the worker's own stream objects.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

WORKER_VARIABLES = frozenset(
    {
        "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
        "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_TIMER_FILE", "AGENTD_OWNER", "AGENTD_ATTEMPT",
        "AGENTD_CONTROL_FILE", "AGENTD_PROGRESS_PIPE", "AGENTD_DUMP_SIGNAL",
        "AGENTD_STACK_FILE", "CUDA_VISIBLE_DEVICES",
    }
)  # fmt: skip
"""The variables a worker's environment adds to the zygote's (``workers.env.worker_env``
over ``common_env``; a test holds the two alike): a library that reads one at import
reads the zygote's (none) where a spawned worker reads its own."""

LIGHTNING_RANK = "lightning_utilities.core.rank_zero"
"""The module whose ``rank_zero_only.rank`` Lightning sets from the environment at import."""
LIGHTNING_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""What Lightning reads for it, in its order (``lightning.fabric.utilities.rank_zero``)."""


@contextlib.contextmanager
def environment_reads() -> Iterator[set[str]]:
    """Record the names of the environment variables read while the block runs (by
    ``os.environ[...]``, ``.get``, ``in`` or ``os.getenv``; not by native code)."""
    read: set[str] = set()
    environ_type = type(os.environ)
    original = environ_type.__getitem__

    def getitem(self: Any, key: Any) -> Any:
        if self is os.environ and isinstance(key, str):
            read.add(key)
        return original(self, key)

    environ_type.__getitem__ = getitem  # type: ignore[method-assign]
    try:
        yield read
    finally:
        environ_type.__getitem__ = original  # type: ignore[method-assign]


def rederived() -> frozenset[str]:
    """The variables whose import-time use :func:`rederive` redoes in each worker, for
    the libraries this process imported."""
    if _lightning_rank() is None:
        return frozenset()
    return frozenset(LIGHTNING_RANK_VARIABLES)


def unshared_reads(read: set[str]) -> list[str]:
    """Of the variables ``read`` at import, those a worker sets for itself that no
    re-derivation covers, sorted."""
    return sorted((read & WORKER_VARIABLES) - rederived())


def varying(reads: Mapping[str, list[str]], virtual_local_rank: bool) -> dict[str, list[str]]:
    """Of a zygote's report of :func:`unshared_reads` by module, the variables whose value
    differs between a worker and the zygote: each worker's ``CUDA_VISIBLE_DEVICES`` is
    the agent's (the zygote's), except with ``--virtual-local-rank``."""
    found = {
        module: [n for n in names if n != "CUDA_VISIBLE_DEVICES" or virtual_local_rank]
        for module, names in reads.items()
    }
    return {module: names for module, names in found.items() if names}


def rederive(zygote_streams: Mapping[str, Any]) -> None:
    """In a forked worker whose environment and ``sys.std*`` are its own now: redo what the
    preloaded libraries derived from the zygote's at import. ``zygote_streams`` maps
    ``"stdout"``/``"stderr"`` to the stream objects the zygote had."""
    function = _lightning_rank()
    if function is not None:
        function.rank = _lightning_rank_from(os.environ)
    if "logging" in sys.modules:
        _move_stream_handlers(zygote_streams)


def _lightning_rank() -> Any:
    """Lightning's ``rank_zero_only`` function where its import gave it a rank."""
    module = sys.modules.get(LIGHTNING_RANK)
    function = getattr(module, "rank_zero_only", None)
    return function if hasattr(function, "rank") else None


def _lightning_rank_from(env: Mapping[str, str]) -> int:
    """The rank Lightning's import reads: the first of its variables set, else 0."""
    for name in LIGHTNING_RANK_VARIABLES:
        value = env.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:  # where Lightning's own import fails; agentd's ranks are ints
                return 0
    return 0


def _move_stream_handlers(zygote_streams: Mapping[str, Any]) -> None:
    import logging

    moves = {id(old): getattr(sys, name) for name, old in zygote_streams.items()}
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler):
                new = moves.get(id(handler.stream))
                if new is not None:
                    handler.stream = new
