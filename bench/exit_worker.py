"""Benchmark worker for bench_exit.py: a gloo job of one all-reduce that stamps when its
own code was done (``$BENCH_EXIT_STAMPS/<rank>``): what follows is its exit."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from report_files import write_report

dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
assert tensor.item() == dist.get_world_size()
dist.destroy_process_group()
write_report(Path(os.environ["BENCH_EXIT_STAMPS"], os.environ["RANK"]), repr(time.time()))
