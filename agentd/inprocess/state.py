"""Hand the survivors' state to the ranks that are new processes (torch only).

Every rank calls these at the same point after ``init_process_group``. On a fresh start
they do nothing and communicate nothing; after an in-process restart, the first of them
in an attempt has the ranks agree which of them hold the job's state, in one small
all-reduce (:mod:`agentd.inprocess.holders`), and the state goes from the lowest of those.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeVar

from agentd.inprocess import holders
from agentd.inprocess.worker import current

T = TypeVar("T")


@dataclass(frozen=True)
class Synced:
    """How this rank's last :func:`sync` that handed state over went: ``route`` is
    ``"process group"`` where its tensors were sent or broadcast through it, ``"shared
    memory"`` where they were copied on each host through host memory, ``"CUDA IPC"``
    where they were copied from a survivor's GPU memory on the same GPU, ``"shared memory
    and CUDA IPC"`` for both; ``seconds``, its time in the call."""

    route: str
    seconds: float


_last: Synced | None = None


def last_sync() -> Synced | None:
    """This process's last :func:`sync` that handed state over (None: none has)."""
    return _last


def sync(*objects: Any) -> bool:
    """Give every rank the state a rank that kept its process holds, in place: a module's
    parameters and buffers or a tensor; anything else with ``state_dict()`` and
    ``load_state_dict()`` (an optimizer, an LR scheduler, a grad scaler) as one pickled
    state dict, since a new rank's may have another shape (no momentum buffers yet).

    Under gloo the tensors go only where they are needed: every rank first shares a
    digest of them, and only the new ranks and any survivor whose digest differs from the
    source's (it missed an optimizer step, say) receive them: tensors in host memory
    point to point from the source; tensors on a GPU in a broadcast to every rank (gloo's
    broadcast stages them through host memory faster than a send does: 222 against 481 ms
    for 256 MiB to 1 of 4 ranks on an H200). With ``AGENTD_SYNC_ROUTE=shared-memory``,
    where each receiver has a rank holding the source's state on its host, that rank
    writes them once into shared memory and they copy them from there, and a tensor on
    the GPU where the receivers' are too they copy from its GPU memory (CUDA IPC); with
    ``cuda-ipc``, CUDA IPC only, where every tensor can go that way
    (:mod:`agentd.inprocess.handover`). Under NCCL everything is broadcast.

    Returns whether the ranks now share a kept rank's state: False when no rank holds the
    job's state (:attr:`~agentd.inprocess.Restart.fresh`: the first attempt, a restart in
    new processes for every rank, or one whose kept ranks were all lost before it began),
    and the caller loads its checkpoint instead."""
    restart = holders.agreed()
    source = restart.source
    if source is None:
        holders.hold(True)
        return not restart.fresh
    import torch
    import torch.distributed as dist

    global _last
    began = time.perf_counter()
    tensors: list[Any] = []
    stateful: list[Any] = []
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
        elif isinstance(obj, torch.nn.Module):
            tensors.extend(obj.state_dict().values())
        elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            stateful.append(obj)
        else:
            raise TypeError(
                f"sync: {type(obj).__name__} is not a tensor, a module or an object with "
                "state_dict() and load_state_dict()"
            )
    holders.hold(dist.get_rank() == source)  # a receiver interrupted holds half of it
    with torch.no_grad():
        gloo = dist.get_backend() == "gloo"
        digests: list[float] = []
        route = "process group"
        if gloo and tensors:
            tensors, digests, handed = _hand_over_on_each_host(tensors, source)
            route = handed or route
        on_host: list[Any] = []
        broadcast: list[Any] = []
        for tensor in tensors:
            (on_host if gloo and tensor.device.type == "cpu" else broadcast).append(tensor)
        if on_host:
            _send_to_those_who_differ(on_host, source, digests)
        for tensor in broadcast:
            dist.broadcast(tensor, src=source)
        for obj in stateful:
            box = [obj.state_dict() if dist.get_rank() == source else None]
            dist.broadcast_object_list(box, src=source)
            if dist.get_rank() != source:
                obj.load_state_dict(box[0])
    _last = Synced(route, time.perf_counter() - began)
    holders.hold(True)
    return True


def _digest(tensors: list[Any]) -> float:
    """A sum over every element, each tensor summed in its own dtype (a float64 sum is 20
    times slower on a CPU): ranks that hold the same tensors agree, since the same sum of
    the same elements gives the same result; a rank one optimizer step behind almost
    surely does not (and NaN agrees with nothing). The sums are read back once per
    device (one synchronisation with a GPU, not one per tensor)."""
    import torch

    sums: dict[Any, list[Any]] = {}
    for tensor in tensors:
        value = tensor.detach().sum()
        value = value.abs() if value.is_complex() else value
        sums.setdefault(value.device, []).append(value.to(torch.float64))
    return sum(float(value) for per in sums.values() for value in torch.stack(per).tolist())


def _hand_over_on_each_host(
    tensors: list[Any], source: int
) -> tuple[list[Any], list[float], str | None]:
    """Hand ``tensors`` over through shared memory where every receiver has a holder of
    the source's state on its host: then none are left to send, and the route they took
    is given. Else all of them, with every rank's digest."""
    import torch.distributed as dist

    from agentd.inprocess import handover

    peers: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peers, handover.me(_digest(tensors), tensors))
    writers = handover.plan(peers, source, set(current().replaced))
    route = handover.hand_over(tensors, peers, writers) if writers is not None else None
    if route is not None:
        return [], [], route
    return tensors, [peer.digest for peer in peers], None


def _send_to_those_who_differ(tensors: list[Any], source: int, digests: list[float]) -> None:
    """Send ``tensors`` from ``source`` to the ranks that are new or whose ``digests``
    (every rank's, of all the tensors synced) differ from the source's."""
    import torch
    import torch.distributed as dist

    from agentd.inprocess.handover import receivers_of

    rank = dist.get_rank()
    receivers = receivers_of(digests, source, set(current().replaced))
    if rank != source and rank not in receivers:
        return
    for tensor in tensors:
        if rank == source:
            message = tensor.detach().contiguous()
            for receiver in receivers:
                dist.send(message, dst=receiver)
        elif tensor.is_contiguous():
            dist.recv(tensor, src=source)
        else:
            message = torch.empty(tensor.shape, dtype=tensor.dtype)
            dist.recv(message, src=source)
            tensor.copy_(message)


def sync_object(value: T) -> T:
    """A picklable value (a step counter, say) as the rank that kept its process has it."""
    source = holders.agreed().source
    if source is None:
        holders.hold(True)
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=source)  # a receiver holds the state once sync() returns
    return box[0]
