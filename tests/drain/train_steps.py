"""A job that counts steps and checkpoints when a drain asks (the drain tests' worker).

``train_steps.py OUT_DIR STOP_FILE``: every rank resumes from the newest checkpoint in
OUT_DIR (``ckpt_<rank>`` holds the step), steps every 10 ms, calls agentd.heartbeat(), and
on agentd.checkpoint_requested() saves and confirms. It notes each start
(``start_<attempt>_<rank>``: world size and the step it resumed at) and exits 0 once
STOP_FILE exists.
"""

import json
import os
import sys
import time

import agentd

out, stop = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
attempt = os.environ["AGENTD_ATTEMPT"]
host = os.environ.get("AGENTD_TEST_HOST", "")


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
write(f"start_{host}{attempt}_{rank}", {"world": world, "resumed_at": step})
while not os.path.exists(stop):
    time.sleep(0.01)
    step += 1
    agentd.heartbeat()
    if agentd.checkpoint_requested():
        write(f"ckpt_{host}{attempt}_{rank}", {"step": step, "at": time.time(), "world": world})
        agentd.checkpoint_saved()
