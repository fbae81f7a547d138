"""Two gloo ranks hand tensors over by each route: ``torch_handover.py RANK INIT_FILE OUT
[receiver-dies]``.

Rank 1 plays a new rank (``replaced``), rank 0 the source that kept its state. One
round per entry of ``ROUNDS``, each with its ``AGENTD_SYNC_ROUTE`` per rank: through
shared memory (and CUDA IPC for the tensors on a GPU); with rank 0's ``/dev/shm``
missing (its segment cannot be made: both fall back); with the group's route on rank 1;
with the first tensor said to be on one GPU for both, and rank 0's export of its GPU
memory failing, then rank 1's mapping of it (both fall back); with a stand-in for CUDA
IPC that runs anywhere (the exported "handles" are the tensors' values), for every
tensor, then for the first only; CUDA IPC only, with a tensor in host memory (both fall
back); and CUDA IPC only for all but that tensor (real CUDA IPC on a GPU; the group on
the CPU). Each rank writes ``OUT/<RANK>.json``: per round, the route and whether rank
1's tensors (of several dtypes, one non-contiguous, one empty; on ``TEST_DEVICE``, the
CPU by default, the last always on the CPU) equal rank 0's. With ``receiver-dies``, rank 1
dies as it would open rank 0's segment, and rank 0 writes how its ``sync()`` failed and
which of its segments are left in ``/dev/shm``. With ``holders``, the agent's plan
(rank 0 hands over, rank 1 is new) meets other facts: rank 1 alone holds the job's state,
then neither does, then both do while the plan names no source, then both do but rank
0's is an earlier round's (its node sat a round out), then both do but rank 0's agent
calls its state stale (its node sat a round out as a spare), then rank 0 alone does and
its state is stale; each rank writes, per case, what ``sync()`` returned, the source and
new ranks agreed, and whether its tensors are then rank 1's.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import agentd.inprocess as inprocess
from agentd.inprocess import cuda_ipc, handover, holders, worker

rank, init, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)


def restarted() -> None:
    """An attempt after an in-process restart, as a resume would begin it: rank 0 kept its
    process and holds the job's state, rank 1 is new."""
    worker.agree(worker.Restart(count=1, replaced=(1,), source=0, fresh=False))
    holders.hold(rank == 0)


restarted()


device = torch.device(os.environ.get("TEST_DEVICE", "cpu"))


def tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(300, 7, generator=g).to(device),
        torch.randn(5, 9, generator=g).to(device).t(),  # not contiguous
        torch.randint(0, 1 << 40, (33,), generator=g).to(device),
        torch.rand(17, generator=g).to(device) > 0.5,
        torch.randn(64, generator=g).to(torch.bfloat16).to(device),
        torch.empty(0, device=device),
        torch.randn(11, generator=g),  # in host memory wherever the others are
    ]


def fail(what: str):
    def failing(*args, **kwargs):
        raise RuntimeError(what)

    return failing


def said_to_be_on_one_gpu(tensors):
    return ("GPU-test", *real["device_keys"](tensors)[1:])


if sys.argv[4:] == ["holders"]:
    cases = {  # name: (the plan's source and new ranks, the round rank 0 and rank 1 hold,
        # and whether rank 0's agent calls its state stale)
        "the planned source holds nothing": ((0, (1,)), (None, 4), False),
        "no rank holds anything": ((0, (1,)), (None, None), False),
        "every rank holds it": ((None, ()), (4, 4), False),
        "rank 0 holds an earlier round's": ((None, ()), (3, 4), False),
        "rank 0's node sat a round out": ((None, ()), (4, 4), True),
        "only a stale rank holds it": ((0, (1,)), (4, None), True),
    }
    found = {}
    for name, ((source, replaced), holding, stale) in cases.items():
        held = holding[rank]
        worker.agree(worker.Restart(count=1, fresh=False, round=held or 0))
        holders.hold(held is not None)  # what a sync of round ``held`` left behind
        worker._stale = stale and rank == 0  # what a resume its agent called stale leaves
        plan = worker.Restart(count=1, replaced=replaced, source=source, fresh=False, round=5)
        worker.agree(plan)
        mine = tensors(seed=rank)
        synced = inprocess.sync(*mine)
        now = inprocess.current()
        found[name] = {
            "synced": synced,
            "source": now.source,
            "replaced": list(now.replaced),
            "fresh": now.fresh,
            "rank 1's": all(torch.equal(a, b) for a, b in zip(mine, tensors(seed=1), strict=True)),
        }
    with open(os.path.join(out, f"{rank}.json"), "w") as fp:
        json.dump(found, fp)
    dist.destroy_process_group()
    sys.exit(0)

if sys.argv[4:] == ["receiver-dies"]:  # rank 1 dies as it would open rank 0's segment
    os.environ[handover.ROUTE_ENV] = handover.SHARED_MEMORY
    if rank == 1:
        handover.os.open = lambda *args, **kwargs: os._exit(3)
    try:
        inprocess.sync(*tensors(seed=rank))
    except Exception as exc:  # the group's failure, seen by the survivor
        failure = f"{type(exc).__name__}: {exc}"
    else:
        failure = ""
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"{handover.PREFIX}{os.getpid()}-")]
    with open(os.path.join(out, f"{rank}.json"), "w") as fp:
        json.dump({"failure": failure, "left": left}, fp)
    # torn down as a park does: torch 2.11's gloo, left to the interpreter's exit after its
    # peer's reset, aborted this process (std::terminate) in 2 of 20 runs; none of 70 so
    dist.destroy_process_group()
    sys.exit(0)


def values(tensors):  # a stand-in for CUDA IPC that runs anywhere: the bytes themselves
    return [t.detach().cpu().clone() for t in tensors]


def on_one_gpu(tensors):  # every tensor with bytes, as if all ranks shared one GPU
    return tuple("GPU-test" if t.numel() else cuda_ipc.HOST for t in tensors)


SHM, IPC, GROUP = handover.SHARED_MEMORY, handover.CUDA_IPC, handover.GROUP
ROUNDS = {  # name: AGENTD_SYNC_ROUTE on rank 0 and on rank 1
    "shared memory": (SHM, SHM),
    "no /dev/shm on the writer": (SHM, SHM),
    "the group's route on rank 1": (SHM, GROUP),
    "GPU memory not exported": (SHM, SHM),
    "GPU memory not mapped": (SHM, SHM),
    "CUDA IPC stand-in": (IPC, IPC),
    "shared memory and a CUDA IPC stand-in": (SHM, SHM),
    "CUDA IPC with a tensor in host memory": (IPC, IPC),
    "CUDA IPC": (IPC, IPC),
}
rounds = {}
real = {name: getattr(cuda_ipc, name) for name in ("device_keys", "export", "open_exported")}
for name, routes in ROUNDS.items():
    restarted()
    os.environ[handover.ROUTE_ENV] = routes[rank]
    handover.SHM_DIR = "/dev/shm"
    for attribute, function in real.items():
        setattr(cuda_ipc, attribute, function)
    if name == "no /dev/shm on the writer" and rank == 0:
        handover.SHM_DIR = os.path.join(out, "missing")
    if name.startswith("GPU memory"):
        cuda_ipc.device_keys = said_to_be_on_one_gpu
        cuda_ipc.export = (lambda ts: [("handle",)] * len(ts)) if rank == 0 else None
        cuda_ipc.open_exported = fail("cannot map that") if rank == 1 else None
    if name == "GPU memory not exported":  # nothing to map: rank 1 must not try
        cuda_ipc.export = fail("cannot export that")
        cuda_ipc.open_exported = lambda *args: os._exit(4)
    if "stand-in" in name:
        cuda_ipc.device_keys = on_one_gpu if name == "CUDA IPC stand-in" else said_to_be_on_one_gpu
        cuda_ipc.export = values
        cuda_ipc.open_exported = lambda handles, devices: list(handles)
    mine = tensors(seed=rank)
    handed = mine[:-1] if name == "CUDA IPC" else mine  # all on the GPU, where there is one
    inprocess.sync(*handed)
    expected = tensors(seed=0)
    rounds[name] = {
        "route": inprocess.last_sync().route,
        "equal": all(torch.equal(a, b) for a, b in zip(handed, expected, strict=False)),
        "contiguous": [t.is_contiguous() for t in mine],
    }
dist.destroy_process_group()
with open(os.path.join(out, f"{rank}.json"), "w") as fp:
    json.dump(rounds, fp)
