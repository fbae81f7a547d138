"""A gloo job that all-reduces until a stop file appears; each rank notes its world size
and restart count when it starts (``start_<attempt>_<rank>`` in the out dir)."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out, stop = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
note = out / f"start_{os.environ.get('GROUP_RANK')}_{rank}_{time.monotonic_ns()}"
partial = out / f".{note.name}"  # whole or not there: the test reads start_* as they land
partial.write_text(json.dumps({"world": world, "restarts": int(attempt), "pid": os.getpid()}))
partial.replace(note)
tensor = torch.ones(1)
while not stop.exists():
    dist.all_reduce(tensor)
    time.sleep(0.02)
dist.barrier()
dist.destroy_process_group()
