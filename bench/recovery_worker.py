"""Benchmark worker for bench_recovery.py: a gloo job that crashes once, then recovers.

``recovery_worker.py OUT_DIR``. Joins the process group and all-reduces; then writes
``past_<restart>_<rank>`` (epoch seconds). On the first attempt, rank 0 writes ``crash``
and exits 1 once every rank is past its all-reduce; the others wait to be stopped. With
``BENCH_MODEL_MB`` set, every rank first builds a model of that size, and rank 0
checkpoints it on the first attempt: a restarted rank reads the checkpoint back, as a
real job does.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from report_files import write_report

out = sys.argv[1]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
rank = dist.get_rank()
model_mb = float(os.environ.get("BENCH_MODEL_MB", "0"))
if model_mb:
    side = int((model_mb * 2**20 / 4) ** 0.5)
    device = os.environ.get("BENCH_DEVICE", "cpu")
    model = torch.nn.Linear(side, side).to(device)
    checkpoint = os.path.join(out, "checkpoint.pt")
    if restart == "0" and rank == 0:
        torch.save(model.state_dict(), checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    elif restart != "0":
        model.load_state_dict(torch.load(checkpoint, map_location=device))
tensor = torch.ones(1)
dist.all_reduce(tensor)
write_report(os.path.join(out, f"past_{restart}_{rank}"), repr(time.time()))
if restart == "0":
    dist.barrier()
    if rank == 0:
        write_report(os.path.join(out, "crash"), repr(time.time()))
        os._exit(1)
    time.sleep(600)  # stopped by the agent
dist.barrier()
dist.destroy_process_group()
