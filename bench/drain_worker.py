"""Benchmark worker of bench_drain.py: a gloo job that counts steps.

``drain_worker.py OUT_DIR STOP_FILE EVERY``: resumes from the newest checkpoint in OUT_DIR,
all-reduces once per step (the ranks move in lockstep), saves a checkpoint every EVERY
steps (0: never) and, under agentd, when a drain asks (``on_checkpoint_request``: it notes
when the callback was entered). Notes each start (``start_<attempt>_<rank>.json``) and,
after every step, how far it got and when (``progress_<attempt>_<rank>.json``). Stops once
STOP_FILE exists.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from report_files import write_report

import agentd

out, stop, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
attempt = os.environ.get("AGENTD_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def write(name: str, doc: dict) -> None:
    write_report(os.path.join(out, name), json.dumps(doc))


def read(name: str) -> dict:
    with open(os.path.join(out, name)) as fp:
        return json.load(fp)


saved = [read(n) for n in os.listdir(out) if n.startswith("ckpt_") and n.endswith(".json")]
step = max((s["step"] for s in saved), default=0)
write(f"start_{attempt}_{rank}.json", {"world": world, "resumed_at": step, "at": time.time()})


@agentd.on_checkpoint_request
def save(at_step: int) -> None:
    write(f"ckpt_drain_{attempt}_{rank}.json", {"step": step, "entered": time.time()})


while True:
    flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    step += 1
    time.sleep(0.005)
    agentd.heartbeat()
    if every and step % every == 0:
        write(f"ckpt_every_{rank}.json", {"step": step})
    write(f"progress_{attempt}_{rank}.json", {"step": step, "at": time.time()})
dist.destroy_process_group()
