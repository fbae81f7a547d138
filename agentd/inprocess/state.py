"""Hand the survivors' state to the ranks that are new processes (torch only).

Every rank calls these at the same point after ``init_process_group``; on a fresh start,
or when no rank was replaced, they do nothing and communicate nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

from agentd.inprocess.worker import current

T = TypeVar("T")


def sync(*objects: Any) -> bool:
    """Give every rank the state a rank that kept its process holds, in place: a module's
    parameters and buffers or a tensor by broadcast; anything else with ``state_dict()``
    and ``load_state_dict()`` (an optimizer, an LR scheduler, a grad scaler) as one pickled
    state dict, since a new rank's may have another shape (no momentum buffers yet).

    Returns whether the ranks now share a kept rank's state: False when no rank kept its
    process (:attr:`~agentd.inprocess.Restart.fresh`: the first attempt, or a restart in
    new processes for every rank), and the caller loads its checkpoint instead."""
    restart = current()
    source = restart.source
    if source is None:
        return not restart.fresh
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for obj in objects:
            if isinstance(obj, torch.Tensor):
                dist.broadcast(obj, src=source)
            elif isinstance(obj, torch.nn.Module):
                for tensor in obj.state_dict().values():
                    dist.broadcast(tensor, src=source)
            elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
                box = [obj.state_dict() if dist.get_rank() == source else None]
                dist.broadcast_object_list(box, src=source)
                if dist.get_rank() != source:
                    obj.load_state_dict(box[0])
            else:
                raise TypeError(
                    f"sync: {type(obj).__name__} is not a tensor, a module or an "
                    "object with state_dict() and load_state_dict()"
                )
    return True


def sync_object(value: T) -> T:
    """A picklable value (a step counter, say) as the rank that kept its process has it."""
    source = current().source
    if source is None:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=source)
    return box[0]
