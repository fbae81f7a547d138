"""A real gloo job that counts steps and checkpoints on a drain (the callback API).

``gloo_steps.py OUT_DIR STOP_FILE``: every rank resumes from the newest checkpoint,
all-reduces once per step (so the ranks move in lockstep), and saves from the
``agentd.on_checkpoint_request`` callback (``ckpt_<attempt>_<rank>``: the step and when the
callback was entered). It notes each start and stops, all ranks at the same step, once
STOP_FILE exists.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import agentd

out, stop = sys.argv[1], sys.argv[2]
attempt = os.environ["AGENTD_ATTEMPT"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def write(name: str, doc: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as fp:
        json.dump(doc, fp)
    os.replace(path + ".tmp", path)


def read(name: str) -> dict:
    with open(os.path.join(out, name)) as fp:
        return json.load(fp)


saved = [read(n) for n in os.listdir(out) if n.startswith("ckpt_") and not n.endswith(".tmp")]
step = max((s["step"] for s in saved), default=0)
write(f"start_{attempt}_{rank}", {"world": world, "resumed_at": step})


@agentd.on_checkpoint_request
def save(at_step: int) -> None:
    write(f"ckpt_{attempt}_{rank}", {"step": step, "entered": time.time(), "world": world})


while True:
    flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    step += 1
    time.sleep(0.005)
    agentd.heartbeat()
dist.destroy_process_group()
