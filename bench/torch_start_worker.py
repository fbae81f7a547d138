"""Benchmark worker for bench_preload.py: ``torch_start_worker.py OUT_DIR [SLEEP]``.

Imports torch, runs a small model step, writes ``ready_<rank>`` (epoch seconds, pid), then
sleeps SLEEP seconds (0: exits) so its memory can be read.
"""

import os
import sys
import time

import torch
from report_files import write_report

model = torch.nn.Linear(256, 256)
model(torch.randn(32, 256)).sum().backward()
rank = os.environ["LOCAL_RANK"]
write_report(os.path.join(sys.argv[1], f"ready_{rank}"), f"{time.time()!r} {os.getpid()}")
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
