"""The benchmark's training job: gloo DDP on CPU, steps of about --step seconds.

``hang_worker.py OUT --step 1 --hang-at 12 --steps-after 3 --collective-timeout 30``.
On the first attempt, rank 1 sleeps inside step --hang-at (before its backward, so the
others wait for it in DDP's gradient all_reduce) and writes ``OUT/hang_at`` (epoch
seconds). A rank whose collective times out writes ``OUT/failed_at_<rank>`` before the
error ends it (torchrun's detection). On a restart every rank trains --steps-after
steps, then writes ``OUT/resumed_<rank>`` (when its first step ended) and exits 0.
Heartbeats once per step (a no-op under torchrun).
"""

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from report_files import write_report
from torch.nn.parallel import DistributedDataParallel

import agentd

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--step", type=float, default=1.0)
parser.add_argument("--hang-at", type=int, default=12)
parser.add_argument("--steps-after", type=int, default=3)
parser.add_argument("--collective-timeout", type=float, default=30.0)
args = parser.parse_args()
out = Path(args.out)
restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"

timeout = datetime.timedelta(seconds=args.collective_timeout)
dist.init_process_group("gloo", timeout=timeout)
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)


def write(name: str, value: float) -> None:
    write_report(out / name, repr(value))


def step(number: int) -> None:
    started = time.monotonic()
    loss = torch.nn.functional.mse_loss(model(x), y)
    time.sleep(max(0.0, args.step - (time.monotonic() - started)))  # the step's compute
    if not restarted and rank == 1 and number == args.hang_at:
        write("hang_at", time.time())
        time.sleep(3600)  # stuck: a data loader, a deadlock, a dead NIC
    optimizer.zero_grad()
    loss.backward()  # DDP's all_reduce of the gradients
    optimizer.step()


try:
    for number in range(1, (args.steps_after if restarted else 10**6) + 1):
        step(number)
        agentd.heartbeat()
        if restarted and number == 1:
            write(f"resumed_{rank}", time.time())
except Exception:
    write(f"failed_at_{rank}", time.time())
    raise
agentd.end_heartbeats()
dist.destroy_process_group()
