"""A small data-parallel training job: DDP over gloo on CPU, run unchanged by torchrun or agentd.

agentd run --standalone --nproc-per-node 2 examples/train.py --steps 50
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    true_w = torch.tensor([[2.0], [-3.0]])
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(rank)  # each rank sees its own shard of data
    for step in range(args.steps):
        x = torch.randn(64, 2, generator=generator)
        y = x @ true_w + 0.5
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(
                f"step {step:3d} loss {loss.item():.4f} (world {world}, "
                f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')})",
                flush=True,
            )
    if rank == 0:
        weight = model.module.weight.detach().flatten().tolist()
        print(f"learned weight {[round(w, 2) for w in weight]} (true [2.0, -3.0])", flush=True)
    dist.barrier()  # rank 0 hosts the process group's store: nobody may leave before all are done
    # Free DDP's reducer, which holds gloo's work, while the interpreter is whole: freed at
    # the interpreter's exit instead, torch 2.13's gloo aborts the process (SIGABRT,
    # "terminate called without an active exception") in about 1 run of 6 on a busy host.
    del model, optimizer
    gc.collect()  # the model's reference cycles too
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
