"""A torch.distributed job that leans on the workers' store: ``torch_store.py MODE``.

``allreduce``: every rank all-reduces rank + 1 and prints the sum.
``late``: rank 0 leaves the moment the process group is torn down; the others use the
store a second later (a worker's exit must not pull the store from under its peers).
``restart``: attempt 0 records its store's port, marks the store, and fails on rank 1
after an all-reduce; attempt 1 checks that the old store is gone and that its own works.
The port is kept by local rank: ranks follow the order in which agents join a round, and
that order may change from one round to the next. Something that answers on the old port
is the old store only if it holds the mark: on a busy host the freed port may already be
another listener's (a gloo rank's, say, of this very attempt).
"""

import asyncio
import os
import sys
import time

import torch
import torch.distributed as dist


async def holds(addr: str, port: int, key: str) -> bool:
    """Whether a TCPStore at ``addr:port`` holds ``key`` (torch's client writes the keys
    under a ``/``); agentd's client, whose wait a timeout bounds: torch's, facing a
    listener that never answers, waits for ever."""
    from agentd.tcpstore.client import TCPStoreClient

    client = await TCPStoreClient.connect(addr, port, 0)
    try:
        return await client.check([key])
    finally:
        await client.close()


mode = sys.argv[1]
out = os.environ.get("TEST_AGENTD_OUT", ".")
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
    addr, mark = os.environ["MASTER_ADDR"], "torch_store_test/attempt_0"
    if attempt == 0:
        with open(kept, "w") as fp:
            fp.write(port)
        dist.TCPStore(addr, int(port), is_master=False).set(mark, "1")
        dist.barrier()
        if rank == 1:
            sys.exit(3)
        time.sleep(60)  # stopped by the restart
    with open(kept) as fp:
        old = fp.read()
    assert old != port, "a new attempt, a new store"
    try:
        answers = asyncio.run(asyncio.wait_for(holds(addr, int(old), "/" + mark), 3))
    except (OSError, EOFError):  # nothing listens there, or no store (or a silent one)
        answers = False
    print(f"rank {rank}: the old store {'still answers' if answers else 'is gone'}", flush=True)
    dist.barrier()
dist.destroy_process_group()
