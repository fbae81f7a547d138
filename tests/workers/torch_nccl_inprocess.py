"""NCCL jobs that restart in process on one GPU: ``torch_nccl_inprocess.py OUT MODE``.

``raise`` (one rank): the training function joins an NCCL group, all-reduces a CUDA
tensor and raises on its first 5 calls; the 6th returns. ``blocked`` (two ranks, one
GPU: the world is gloo, and each rank all-reduces on an NCCL group of its own): rank 0
loops over NCCL all-reduces and CUDA synchronisations until its training function is
interrupted; rank 1 dies on attempt 0. Every call appends a JSON line to
``OUT/rank<RANK>.jsonl``: pid, call, the restart agentd reports, the GPU memory held
(the allocator's, and the device's used memory, NCCL's buffers included), when the call
began (``called_at``) and how long the last park's teardown took (``teardown_s``: NCCL's
groups forgotten, their abort left to a thread, which the memory figures wait for; the
abort itself under ``AGENTD_INPROCESS_NCCL_ABORT=wait``); each raise appends its time to
``OUT/rank<RANK>.raised``, so a restart's time is the next call's start less the raise.
"""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import agentd.inprocess as inprocess

out, mode = sys.argv[1], sys.argv[2]
torch.cuda.set_device(0)
calls = 0
called_at = 0.0


def report(**fields: object) -> None:
    torch.cuda.synchronize()
    for thread in threading.enumerate():  # the last park's groups, aborting meanwhile
        if thread.name == "agentd-nccl-abort":
            thread.join()
    free, total = torch.cuda.mem_get_info()
    line = {
        "pid": os.getpid(),
        "call": calls,
        "count": inprocess.current().count,
        "allocated": torch.cuda.memory_allocated(),
        "device_used": total - free,
        "teardown_s": inprocess.current().teardown_s,
        "called_at": called_at,
        **fields,
    }
    with open(os.path.join(out, f"rank{os.environ['RANK']}.jsonl"), "a") as fp:
        fp.write(json.dumps(line) + "\n")


def train_raise() -> None:
    global calls, called_at
    calls += 1
    called_at = time.time()
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    tensor = torch.full((1 << 20,), float(calls), device="cuda")
    dist.all_reduce(tensor)
    report(value=float(tensor[0]))
    if calls <= 5:
        with open(os.path.join(out, f"rank{os.environ['RANK']}.raised"), "a") as fp:
            fp.write(f"{time.time()}\n")
        raise RuntimeError(f"loss is NaN (call {calls})")
    dist.destroy_process_group()


def train_blocked() -> None:
    global calls
    calls += 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    own = [dist.new_group([r], backend="nccl") for r in range(dist.get_world_size())][rank]
    tensor = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(tensor, group=own)
    report()
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        dist.barrier()
        if rank == 1:
            os._exit(1)
        while True:  # interrupted by the park: the NCCL wait returns, then Interrupted
            dist.all_reduce(tensor, group=own)
            torch.cuda.synchronize()
            time.sleep(0.001)
    dist.barrier()
    dist.destroy_process_group()


inprocess.run(train_raise if mode == "raise" else train_blocked)
