"""A real torch.distributed job: gloo process group from the environment, one all-reduce."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
tensor = torch.tensor([rank + 1.0])
dist.all_reduce(tensor)
print(f"rank {rank}/{world} all_reduce={tensor.item():g}", flush=True)
dist.barrier()  # rank 0 hosts the group's store: nobody leaves before everyone is done
dist.destroy_process_group()
