"""A torch.distributed job that leans on the workers' store: ``torch_store.py MODE``.

``allreduce``: every rank all-reduces rank + 1 and prints the sum.
``late``: rank 0 leaves the moment the process group is torn down; the others use the
store a second later (a worker's exit must not pull the store from under its peers).
``restart``: attempt 0 records its store's port and fails on rank 1 after an all-reduce;
attempt 1 checks that the old store is gone and that its own works. The port is kept by
local rank: ranks follow the order in which agents join a round, and that order may change
from one round to the next.
"""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
out = os.environ.get("AGENTD_TEST_OUT", ".")
attempt = int(os.environ.get("AGENTD_ATTEMPT", "0"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.tensor([rank + 1.0])
dist.all_reduce(tensor)
print(f"rank {rank}/{world} all_reduce={tensor.item():g}", flush=True)
store = dist.distributed_c10d._get_default_store()
if mode == "late":
    dist.barrier()
    if rank != 0:
        time.sleep(1.0)  # rank 0 is gone by now
        store.set(f"late/{rank}", "1")
        assert store.get(f"late/{rank}") == b"1"
        print(f"rank {rank} used the store after rank 0 left", flush=True)
elif mode == "restart":
    port = os.environ["MASTER_PORT"]
    kept = os.path.join(out, f"port_{os.environ['LOCAL_RANK']}")
    if attempt == 0:
        with open(kept, "w") as fp:
            fp.write(port)
        dist.barrier()
        if rank == 1:
            sys.exit(3)
        time.sleep(60)  # stopped by the restart
    with open(kept) as fp:
        old = fp.read()
    assert old != port, "a new attempt, a new store"
    try:
        socket.create_connection((os.environ["MASTER_ADDR"], int(old)), timeout=2).close()
        print(f"rank {rank}: the old store still answers", flush=True)
    except OSError:
        print(f"rank {rank}: the old store is gone", flush=True)
    dist.barrier()
dist.destroy_process_group()
