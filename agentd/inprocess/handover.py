"""The survivors' tensors handed to the new ranks of their host through shared memory
(``AGENTD_SYNC_SHARED_MEMORY=1``; off by default, measured below).

A new rank usually runs on the host where the rank it replaces ran, beside survivors that
hold the job's state. Under gloo the process group sends it the tensors over a loopback
TCP stream (and, for tensors on a GPU, broadcasts them to every rank, staged through host
memory on each side); through shared memory, one rank writes them once and every new rank
of its host copies them. :func:`hand_over` plans, from what every rank says of itself
(:class:`Peer`: where it runs, a digest of its tensors, its pid), which rank holding the
source's state writes for which receivers; it writes its tensors into a file under
``/dev/shm``, and its receivers copy them into theirs. A new rank with no such rank on
its host, a ``/dev/shm`` without room, or any rank without the switch on makes every rank
fall back to the process group, decided by every rank alike from the same facts.

Which is faster depends on the host: on the 2-core VM of docs/benchmarks.md, a 256 MiB
model reaches the new rank 188 ms after it joined the group through the group, and 282 ms
through shared memory (the kernel copies it in, then out, where gloo's send and receive
overlap); ``bench/gpu_check.sh`` measures both with the model on a GPU, where the group's
route is a broadcast to every rank. See docs/inprocess.md, "The hand-over's route".

A segment is unlinked as soon as its receivers have it open; one left by a rank killed in
between is removed by the next writer on its host (its pid is in its name).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

SHM_DIR = "/dev/shm"
PREFIX = "agentd-sync-"
SWITCH_ENV = "AGENTD_SYNC_SHARED_MEMORY"
"""``1`` on every rank: the tensors go through shared memory where they can."""
ALIGN = 64


@dataclass(frozen=True)
class Peer:
    """What a rank says of itself before a hand-over: ``place`` names its host and its
    ``/dev/shm`` (None: it takes no part), ``digest`` its tensors' digest."""

    place: str | None
    digest: float
    pid: int
    token: str


def this_place() -> str | None:
    """The host and the ``/dev/shm`` this process sees (ranks in containers of one host
    may see different ones), or None where there is none or the switch is not on."""
    if os.environ.get(SWITCH_ENV, "0") != "1":
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as fp:
            boot = fp.read().strip()
        shm = os.stat(SHM_DIR)
    except OSError:
        return None
    return f"{boot}:{shm.st_dev}:{shm.st_ino}"


def me(digest: float) -> Peer:
    return Peer(this_place(), digest, os.getpid(), os.urandom(8).hex())


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


def hand_over(tensors: list[Any], peers: list[Peer], writers: dict[int, list[int]]) -> bool:
    """Carry out ``writers`` (from :func:`plan`, which every rank computed alike): True
    once this rank's part is done, False when every rank must fall back to the process
    group (a segment could not be written or opened; nothing was copied then)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = next((w for w, rs in writers.items() if rank in rs), None)
    path, made = None, None
    if rank in writers:
        path = _segment(peers[rank])
        made = _write(path, tensors)
    written: list[Any] = [None] * world
    answers: list[Any] = [None] * world
    fd: int | None = None
    try:
        dist.all_gather_object(written, made)
        opened: str | None = "ok"
        if all(written[w] == "ok" for w in writers) and mine is not None:
            theirs = _segment(peers[mine])
            try:
                fd = os.open(theirs, os.O_RDONLY)
            except OSError as exc:
                opened = f"{theirs}: {exc.strerror}"
        dist.all_gather_object(answers, opened)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    finally:  # its receivers have it open, or the hand-over failed (a peer died, say)
        if path is not None and made == "ok":
            with contextlib.suppress(OSError):
                os.unlink(path)
    ok = all(written[w] == "ok" for w in writers) and all(a == "ok" for a in answers)
    if fd is not None:
        try:
            if ok:
                _read(fd, tensors)
        finally:
            os.close(fd)
    return ok


def _segment(writer: Peer) -> str:
    """The path of ``writer``'s segment (its pid first: see :func:`_remove_the_dead_ones`)."""
    return os.path.join(SHM_DIR, f"{PREFIX}{writer.pid}-{writer.token}")


def _offsets(tensors: list[Any]) -> list[int]:
    """Where each tensor's bytes start in a segment (each aligned to :data:`ALIGN`)."""
    offsets, size = [], 0
    for tensor in tensors:
        offsets.append(size)
        size += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return offsets


def _bytes(tensor: Any) -> memoryview:
    """A contiguous host tensor's bytes, shared with it (written or read in place)."""
    import torch

    return memoryview(tensor.detach().view(-1).view(torch.uint8).numpy()).cast("B")


def _write(path: str, tensors: list[Any]) -> str:
    """Write ``tensors`` to a new segment at ``path`` (the kernel copies them in: no
    page of it is mapped here): "ok", or why it could not be (a full ``/dev/shm`` is
    ENOSPC here)."""
    _remove_the_dead_ones()
    offsets = _offsets(tensors)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        for tensor, offset in zip(tensors, offsets, strict=True):
            if tensor.numel():
                data = _bytes(tensor.detach().contiguous().cpu())
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return f"{path}: {exc.strerror}"
    finally:
        os.close(fd)
    return "ok"


def _read(fd: int, tensors: list[Any]) -> None:
    """Copy the segment open as ``fd`` into ``tensors``: straight into a contiguous host
    tensor's memory, through a host buffer for one on a GPU or not contiguous."""
    import torch

    offsets = _offsets(tensors)
    for tensor, offset in zip(tensors, offsets, strict=True):
        count = tensor.numel() * tensor.element_size()
        if not count:
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
    """Remove the segments of writers that died before they unlinked them."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if not name.startswith(PREFIX):
                continue
            pid = name[len(PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
