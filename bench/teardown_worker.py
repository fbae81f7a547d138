"""Benchmark worker for bench_teardown.py: a gloo job that ends the way torch documents.

Joins the process group, all-reduces once, meets in ``dist.barrier()`` and leaves with
``destroy_process_group()``: the shortest correct job, so the ranks' exits race.
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
assert tensor.item() == dist.get_world_size()
dist.barrier()
dist.destroy_process_group()
