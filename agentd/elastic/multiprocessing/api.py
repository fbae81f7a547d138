"""``torch.distributed.elastic.multiprocessing.api``: the output settings, the process
results and the signal exception, as torch's users name them.

``start_processes`` and the process contexts run agentd's workers
(:mod:`agentd.workers.pcontext`).
"""

from __future__ import annotations

from typing import TypeVar

from agentd.exceptions import SignalException
from agentd.spec import Std
from agentd.workers.logs_specs import DefaultLogsSpecs, LogsDest, LogsSpecs
from agentd.workers.pcontext import (
    MultiprocessContext,
    PContext,
    RunProcsResult,
    SubprocessContext,
    start_processes,
)
from agentd.workers.process_failure import ProcessFailure

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "MultiprocessContext",
    "PContext",
    "ProcessFailure",
    "RunProcsResult",
    "SignalException",
    "Std",
    "SubprocessContext",
    "start_processes",
    "to_map",
]

_T = TypeVar("_T")


def to_map(val_or_map: _T | dict[int, _T], local_world_size: int) -> dict[int, _T]:
    """One value for every local rank, or the given per-rank map checked for all of them."""
    if isinstance(val_or_map, dict):
        missing = set(range(local_world_size)) - set(val_or_map)
        if missing:
            raise ValueError(
                f"val_or_map: {val_or_map!r} has no value for local ranks {sorted(missing)}"
            )
        return dict(val_or_map)
    return dict.fromkeys(range(local_world_size), val_or_map)
