"""Benchmark worker for bench_node_loss.py: a gloo job that trains until a stop file exists.

``node_loss_worker.py OUT_DIR STOP_FILE [plain]``. Each call of the training function
(wrapped in :func:`agentd.inprocess.run`, or called plainly with ``plain``) joins the
process group, takes a survivor's model, and all-reduces every few milliseconds; after
its first all-reduce it writes ``round_<MASTER_PORT>_<RANK>.json`` (epoch seconds, world
size, pid, in-process restarts).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from report_files import write_report

import agentd.inprocess as inprocess

out, stop = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)


def train() -> None:
    dist.init_process_group("gloo")
    inprocess.sync(model)
    first = True
    while not os.path.exists(stop):
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= dist.get_world_size()
        if first:
            report = {
                "at": time.time(),
                "world": dist.get_world_size(),
                "pid": os.getpid(),
                "count": inprocess.current().count,
            }
            name = f"round_{os.environ['MASTER_PORT']}_{dist.get_rank()}.json"
            write_report(os.path.join(out, name), json.dumps(report))
            first = False
        time.sleep(0.005)
    dist.barrier()
    dist.destroy_process_group()


if sys.argv[3:] == ["plain"]:
    train()
else:
    inprocess.run(train)
