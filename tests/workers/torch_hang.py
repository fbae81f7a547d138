"""A gloo job whose rank --hang-rank hangs inside step --hang-at of attempt 0 (and only
once in the job with --once-file), while the others wait for it in all_reduce.
Heartbeats once per step; prints ``trained <rank>``."""

import argparse
import os
import time

import torch
import torch.distributed as dist

import agentd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step", type=float, default=0.1)
parser.add_argument("--hang-rank", type=int, default=1)
parser.add_argument("--hang-at", type=int, default=12)
parser.add_argument("--once-file", default="", help="hang only if this file can be created")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
weights = torch.zeros(2)


def first_hang() -> bool:
    """Whether this is the job's first hang (ranks move between nodes on a restart)."""
    if not args.once_file:
        return True
    try:
        os.close(os.open(args.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def compute(step: int) -> torch.Tensor:
    time.sleep(args.step)
    if first_attempt and rank == args.hang_rank and step == args.hang_at and first_hang():
        time.sleep(3600)  # a stuck data loader, say
    return torch.ones(2)


for step in range(1, args.steps + 1):
    grad = compute(step)
    dist.all_reduce(grad)
    weights -= 0.1 * grad
    agentd.heartbeat()
agentd.end_heartbeats()
dist.barrier()
print(f"trained {rank}", flush=True)
dist.destroy_process_group()
