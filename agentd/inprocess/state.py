"""Hand the survivors' state to the ranks that are new processes (torch only).

Every rank calls these at the same point after ``init_process_group``; on a fresh start,
or when no rank was replaced, they do nothing and communicate nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

from agentd.inprocess.worker import current

T = TypeVar("T")


def sync(*objects: Any) -> None:
    """Broadcast each module's parameters and buffers (or each tensor) from a rank that
    kept its process to every rank, in place."""
    source = current().source
    if source is None:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for obj in objects:
            tensors = list(obj.state_dict().values()) if hasattr(obj, "state_dict") else [obj]
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor):
                    dist.broadcast(tensor, src=source)


def sync_object(value: T) -> T:
    """A picklable value (a step counter, say) as the rank that kept its process has it."""
    source = current().source
    if source is None:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=source)
    return box[0]
