"""A writer's GPU tensors mapped by its receivers on the same GPU (CUDA IPC), for the
shared-memory hand-over (:mod:`agentd.inprocess.handover`).

Where every receiver's tensor lives on the very GPU where the writer's does (the same
UUID: the ranks of a job that share one GPU), the writer exports the tensor's memory as
``torch.multiprocessing`` shares a CUDA tensor (an IPC handle of its allocation, and an
event the receiver waits on for the writer's pending work), and each receiver maps it
and copies it device to device: no host memory on the way, no process group. A tensor on
a GPU of its own, as each rank's is on a node with a GPU per rank, is not mapped: that
would make a context on the writer's GPU in the receiver. Its bytes go through the
shared-memory segment instead.

Nothing here touches CUDA unless a tensor is on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HOST = ""
"""The device key of a tensor that is not mapped: in host memory, or empty."""


def device_keys(tensors: Sequence[Any]) -> tuple[str, ...]:
    """Each tensor's GPU by its UUID (the same across processes, whatever devices each
    sees), :data:`HOST` for a tensor in host memory or an empty one."""
    keys: list[str] = []
    uuids: dict[int, str] = {}
    for tensor in tensors:
        if tensor.device.type != "cuda" or not tensor.numel():
            keys.append(HOST)
            continue
        index = tensor.device.index
        if index not in uuids:
            import torch

            uuids[index] = str(torch.cuda.get_device_properties(index).uuid)
        keys.append(uuids[index])
    return tuple(keys)


def mapped_by(writer: Sequence[str], receivers: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """The indices of the tensors the ``receivers`` map from the ``writer`` (each side's
    :func:`device_keys`): those on a GPU where every receiver's tensor is on that GPU."""
    return tuple(
        i
        for i, key in enumerate(writer)
        if key != HOST and all(len(keys) == len(writer) and keys[i] == key for keys in receivers)
    )


def export(tensors: Sequence[Any]) -> list[tuple[Any, ...]]:
    """What a receiver needs to map each of ``tensors`` (picklable)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [reduce_tensor(tensor.detach())[1] for tensor in tensors]


DEVICE_ARG = 6
"""Where the device's index is in what torch's ``reduce_tensor`` gives for a CUDA tensor."""


def open_exported(exported: Sequence[tuple[Any, ...]], devices: Sequence[int]) -> list[Any]:
    """The writer's tensors (from :func:`export`), mapped into this process on
    ``devices``, this process's index of each one's GPU (the writer's may differ: each
    process numbers the GPUs it sees)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    mapped = []
    for args, index in zip(exported, devices, strict=True):
        if not isinstance(args[DEVICE_ARG], int):
            found = args[DEVICE_ARG]
            raise TypeError(f"torch's CUDA IPC arguments changed: {found!r} is no device index")
        here = list(args)
        here[DEVICE_ARG] = index
        mapped.append(rebuild_cuda_tensor(*here))
    return mapped


def copy_mapped(tensors: Sequence[Any], mapped: Sequence[Any]) -> None:
    """Copy each mapped tensor into the matching one of ``tensors``, and wait until the
    copies are done (the writer may change its tensors once this returns)."""
    import torch

    for tensor, source in zip(tensors, mapped, strict=True):
        tensor.copy_(source)
    for device in {tensor.device for tensor in tensors if tensor.device.type == "cuda"}:
        torch.cuda.synchronize(device)
