"""Stopped workers' GPU memory, seen by the next attempt: ``torch_gpu_release.py OUT``.

On attempt 0 rank 0 holds 60% of GPU 0's memory and rank 1 5%, and each records its pid;
rank 1 then dies and rank 0 waits to be stopped. What rank 0 holds is more than the GPU
has free beside it: the next attempt cannot start until it is released. On attempt 1
each rank asks NVML which processes hold memory on the GPU and writes
``OUT/seen<RANK>.json``: the old pids among them (the agent must have waited until there
are none).
"""

import json
import os
import sys
import time
from pathlib import Path

import pynvml
import torch

out = sys.argv[1]
rank = os.environ["RANK"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    _, total = torch.cuda.mem_get_info()
    share = 0.6 if rank == "0" else 0.05
    ballast = torch.ones(int(total * share) // 4, device="cuda")  # float32
    torch.cuda.synchronize()
    with open(os.path.join(out, f"pid{rank}"), "w") as fp:
        fp.write(str(os.getpid()))
    if rank == "1":
        while not os.path.exists(os.path.join(out, "pid0")):
            time.sleep(0.01)
        os._exit(1)
    time.sleep(600)  # stopped by the agent
pynvml.nvmlInit()
device = pynvml.nvmlDeviceGetHandleByIndex(0)
holders = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)}
old = {int(Path(out, f"pid{r}").read_text()) for r in "01"}
with open(os.path.join(out, f"seen{rank}.json"), "w") as fp:
    json.dump({"old_pids_holding": sorted(old & holders), "holders": sorted(holders)}, fp)
