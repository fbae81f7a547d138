"""The survivors' tensors handed to the new ranks of their host through shared memory
(``AGENTD_SYNC_ROUTE=shared-memory`` or ``cuda-ipc``; off by default, measured below).

A new rank usually runs on the host where the rank it replaces ran, beside survivors that
hold the job's state. Under gloo the process group sends it the tensors over a loopback
TCP stream (and, for tensors on a GPU, broadcasts them to every rank, staged through host
memory on each side); through shared memory, one rank writes them once and every new rank
of its host copies them. :func:`hand_over` plans, from what every rank says of itself
(:class:`Peer`: where it runs, a digest of its tensors, its pid), which rank holding the
source's state writes for which receivers; it writes its tensors into a file under
``/dev/shm``, and its receivers copy them into theirs. A new rank with no such rank on
its host, a ``/dev/shm`` without room, or a receiver whose route is the group makes every
rank fall back to the process group, decided by every rank alike from the same facts. A
tensor on the GPU where every receiver's tensor is too is not written: the receivers map
the writer's GPU memory and copy it on the GPU (:mod:`agentd.inprocess.cuda_ipc`); with
``cuda-ipc`` (no segment), a tensor that cannot be mapped sends every rank to the group.

Which is faster depends on the host: on the 2-core VM of docs/benchmarks.md, a 256 MiB
model reaches the new rank 188 ms after it joined the group through the group, and 282 ms
through shared memory (the kernel copies it in, then out, where gloo's send and receive
overlap); ``bench/gpu_check.sh`` measures both with the model on a GPU, where the group's
route is a broadcast to every rank and this one CUDA IPC. See docs/inprocess.md, "The
hand-over's route".

A segment is unlinked as soon as its receivers have it open; one left by a rank killed in
between is removed by the next writer on its host: its pid is in its name, and its writer
holds a lock on it until it is unlinked, as a writer of another PID namespace's pid (a
container's, sharing ``/dev/shm``) names another process here, or none.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from agentd.inprocess import cuda_ipc
from agentd.support import tempdirs
from agentd.support.boot import boot_id

SHM_DIR = "/dev/shm"
PREFIX = "agentd-sync-"
ROUTE_ENV = "AGENTD_SYNC_ROUTE"
GROUP, SHARED_MEMORY, CUDA_IPC = "group", "shared-memory", "cuda-ipc"
ROUTES = (GROUP, SHARED_MEMORY, CUDA_IPC)
"""The values of ``AGENTD_SYNC_ROUTE`` (the same on every rank): ``group`` (the default;
``cuda-ipc`` where the agent runs with ``--standby-cuda``),
the process group; ``shared-memory``, a segment in host memory, and CUDA IPC for the
tensors on a GPU the receivers share; ``cuda-ipc``, CUDA IPC only, where every tensor
with any bytes is on a GPU its receivers share (else the process group)."""
ALIGN = 64


def chosen_route() -> str:
    """This rank's ``AGENTD_SYNC_ROUTE`` (ValueError, naming the rule, for another value)."""
    value = os.environ.get(ROUTE_ENV, GROUP)
    if value not in ROUTES:
        raise ValueError(f"{ROUTE_ENV}={value!r}: must be one of {', '.join(ROUTES)}")
    return value


@dataclass(frozen=True)
class Peer:
    """What a rank says of itself before a hand-over: ``place`` names its host and its
    ``/dev/shm`` (None: it takes no part), ``digest`` its tensors' digest, ``segment``
    whether its tensors may go through a segment in host memory."""

    place: str | None
    digest: float
    pid: int
    token: str
    segment: bool = True
    gpus: tuple[str, ...] = ()
    """Each tensor's GPU (:func:`agentd.inprocess.cuda_ipc.device_keys`); () with no place."""


@dataclass(frozen=True)
class Written:
    """What a writer did: ``status`` "ok" or why it could not; ``mapped``, the indices of
    the tensors its receivers map from its GPU memory (``handles``, one per index); the
    others' bytes are in its segment (``in_segment`` of them have any)."""

    status: str
    mapped: tuple[int, ...] = ()
    handles: tuple[Any, ...] = ()
    in_segment: int = 0


def this_place() -> str | None:
    """The host and the ``/dev/shm`` this process sees (ranks in containers of one host
    may see different ones, and CUDA IPC needs one), or None where there is none."""
    boot = boot_id()
    try:
        shm = os.stat(SHM_DIR)
    except OSError:
        return None
    return None if boot is None else f"{boot}:{shm.st_dev}:{shm.st_ino}"


def me(digest: float, tensors: list[Any]) -> Peer:
    route = chosen_route()
    place = this_place() if route != GROUP else None
    gpus = cuda_ipc.device_keys(tensors) if place is not None else ()
    return Peer(place, digest, os.getpid(), os.urandom(8).hex(), route == SHARED_MEMORY, gpus)


def receivers_of(digests: list[float], source: int, replaced: set[int]) -> list[int]:
    """The ranks that need ``source``'s state: the new ones, and any whose digest differs."""
    return [
        r for r, d in enumerate(digests) if r != source and (r in replaced or d != digests[source])
    ]


def plan(peers: list[Peer], source: int, replaced: set[int]) -> dict[int, list[int]] | None:
    """Writer rank → its receivers (:func:`receivers_of`): each reads from the lowest rank
    of its place that holds the source's state. None when a receiver has no such rank
    beside it (the process group hands the tensors over)."""
    receivers = receivers_of([peer.digest for peer in peers], source, replaced)
    holders: dict[str, int] = {}
    for rank, peer in enumerate(peers):
        if rank not in receivers and peer.place is not None:
            holders.setdefault(peer.place, rank)
    writers: dict[int, list[int]] = {}
    for rank in receivers:
        place = peers[rank].place
        if place is None or place not in holders:
            return None
        writers.setdefault(holders[place], []).append(rank)
    return writers


def hand_over(tensors: list[Any], peers: list[Peer], writers: dict[int, list[int]]) -> str | None:
    """Carry out ``writers`` (from :func:`plan`, which every rank computed alike): the
    route the tensors took (:func:`_route`) once this rank's part is done, None when
    every rank must fall back to the process group (a segment could not be written or
    opened, or GPU memory not exported or mapped; nothing was copied then)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = next((w for w, rs in writers.items() if rank in rs), None)
    path: str | None = None
    made: Written | None = None
    held: list[int] = []  # the segment this rank writes, open and locked until unlinked
    if rank in writers:
        path = _segment(peers[rank])
        mapped = cuda_ipc.mapped_by(peers[rank].gpus, [peers[r].gpus for r in writers[rank]])
        segment = all(peers[r].segment for r in (rank, *writers[rank]))
        made = _export(path, tensors, mapped, segment, held)
    written: list[Any] = [None] * world
    answers: list[Any] = [None] * world
    fd: int | None = None
    views: list[Any] = []
    try:
        dist.all_gather_object(written, made)
        opened: str | None = "ok"
        exported = all(written[w].status == "ok" for w in writers)
        if exported and mine is not None:
            opened, fd, views = _open(_segment(peers[mine]), written[mine], tensors)
        dist.all_gather_object(answers, opened)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    finally:  # its receivers have it open, or the hand-over failed (a peer died, say)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            for one in held:
                os.close(one)
    ok = exported and all(a == "ok" for a in answers)
    try:
        if ok and mine is not None:
            if fd is not None:
                _read(fd, tensors, set(written[mine].mapped))
            if views:
                cuda_ipc.copy_mapped([tensors[i] for i in written[mine].mapped], views)
    finally:
        if fd is not None:
            os.close(fd)
        views.clear()
    if not ok:
        return None
    if any(written[w].mapped for w in writers):
        dist.barrier()  # every receiver has copied: the writers may change their tensors
    return _route([written[w] for w in writers])


def _route(written: list[Written]) -> str:
    """How the tensors went: ``"shared memory"`` (a segment in host memory),
    ``"CUDA IPC"`` (all mapped from GPU memory) or ``"shared memory and CUDA IPC"``."""
    ipc = any(w.mapped for w in written)
    host = any(w.in_segment for w in written) or not ipc
    return " and ".join(name for name, used in (("shared memory", host), ("CUDA IPC", ipc)) if used)


def _export(
    path: str, tensors: list[Any], mapped: tuple[int, ...], segment: bool, held: list[int]
) -> Written:
    """Write the tensors not ``mapped`` that have any bytes to a new segment at ``path``
    (where there are some, and only if ``segment``: else the writer cannot; see
    :func:`_write` for ``held``), and export the ``mapped`` ones' GPU memory."""
    skip = set(mapped)
    in_segment = sum(1 for i, t in enumerate(tensors) if i not in skip and t.numel())
    if in_segment and not segment:
        return Written(f"{in_segment} tensors not on a GPU the receivers share", mapped)
    status = _write(path, tensors, skip, held) if in_segment else "ok"
    handles: list[Any] = []
    if status == "ok" and mapped:
        try:
            handles = cuda_ipc.export([tensors[i] for i in mapped])
        except Exception as exc:  # an allocator whose memory cannot be shared, say
            status = f"CUDA IPC export: {type(exc).__name__}: {exc}"
    return Written(status, mapped, tuple(handles), in_segment)


def _open(path: str, writer: Written, tensors: list[Any]) -> tuple[str, int | None, list[Any]]:
    """Open the writer's segment at ``path`` (where it wrote one) and map its exported
    tensors: ("ok", the segment's descriptor or None, the mapped tensors), or why not
    (nothing left open)."""
    fd = None
    if writer.in_segment:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            return f"{path}: {exc.strerror}", None, []
    if not writer.mapped:
        return "ok", fd, []
    try:
        devices = [tensors[i].device.index for i in writer.mapped]
        return "ok", fd, cuda_ipc.open_exported(writer.handles, devices)
    except Exception as exc:  # a GPU this process cannot map memory of, say
        if fd is not None:
            os.close(fd)
        return f"CUDA IPC open: {type(exc).__name__}: {exc}", None, []


def _segment(writer: Peer) -> str:
    """The path of ``writer``'s segment (its pid first: see :func:`_remove_the_dead_ones`)."""
    return os.path.join(SHM_DIR, f"{PREFIX}{writer.pid}-{writer.token}")


def _offsets(tensors: list[Any], skip: set[int]) -> list[int]:
    """Where each tensor's bytes start in a segment (each aligned to :data:`ALIGN`; those
    in ``skip`` take no room)."""
    offsets, size = [], 0
    for i, tensor in enumerate(tensors):
        offsets.append(size)
        if i not in skip:
            size += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return offsets


def _bytes(tensor: Any) -> memoryview:
    """A contiguous host tensor's bytes, shared with it (written or read in place)."""
    import torch

    return memoryview(tensor.detach().view(-1).view(torch.uint8).numpy()).cast("B")


def _write(path: str, tensors: list[Any], skip: set[int], held: list[int]) -> str:
    """Write ``tensors`` but those in ``skip`` to a new segment at ``path`` (the kernel
    copies them in: no page of it is mapped here): "ok", its descriptor, locked, added to
    ``held`` (the caller closes it once the segment is unlinked), or why it could not be
    (a full ``/dev/shm`` is ENOSPC here)."""
    _remove_the_dead_ones()
    offsets = _offsets(tensors, skip)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        tempdirs.hold(fd)
        for i, (tensor, offset) in enumerate(zip(tensors, offsets, strict=True)):
            if tensor.numel() and i not in skip:
                data = _bytes(tensor.detach().contiguous().cpu())
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
    except BaseException as exc:  # nothing left behind, whatever stopped the write
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        if isinstance(exc, OSError):
            return f"{path}: {exc.strerror}"
        raise
    held.append(fd)
    return "ok"


def _read(fd: int, tensors: list[Any], skip: set[int]) -> None:
    """Copy the segment open as ``fd`` into ``tensors`` but those in ``skip``: straight
    into a contiguous host tensor's memory, through a host buffer for one on a GPU or not
    contiguous."""
    import torch

    offsets = _offsets(tensors, skip)
    for i, (tensor, offset) in enumerate(zip(tensors, offsets, strict=True)):
        count = tensor.numel() * tensor.element_size()
        if not count or i in skip:
            continue
        direct = tensor.device.type == "cpu" and tensor.is_contiguous()
        host = tensor if direct else torch.empty(tensor.shape, dtype=tensor.dtype)
        data, done = _bytes(host), 0
        while done < count:
            got = os.preadv(fd, [data[done:]], offset + done)
            if not got:
                raise OSError(f"shared memory segment ended at {offset + done} of its bytes")
            done += got
        if not direct:
            tensor.copy_(host)


def _remove_the_dead_ones() -> None:
    """Remove the segments of writers that died before they unlinked them: no process
    of their pid here, and nobody holds their lock (a writer of another PID namespace)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if not name.startswith(PREFIX):
                continue
            pid = name[len(PREFIX) :].split("-", 1)[0]
            path = os.path.join(SHM_DIR, name)
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and not tempdirs.held(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
