"""An in-process job that steps and checkpoints when a drain asks (no torch):
``inprocess_steps.py OUT [--hang-on-resume]``.

Every rank steps every 10 ms, calling ``agentd.heartbeat()`` once a step, and counts its
steps in this call of the training function. On attempt 0, local rank 1 exits 3 at its
30th step, or later once every other rank noted its 5th (a rank slow to start on a loaded
machine had not, and had no note of attempt 0): the agent restarts the job in process,
ranks 0 and 2 keep their process (and their 30 steps or so behind them) and rank 1 is a
new process. Each rank notes
``OUT/step5_<attempt>_<rank>`` (its pid) at its 5th step of an attempt, and when
``agentd.checkpoint_requested()`` writes ``OUT/ckpt_<rank>`` (its step in this attempt,
its pid, the attempt), confirms, and steps on until the agent stops it. With
``--hang-on-resume``, a rank that kept its process notes ``OUT/resumed_<rank>`` (its pid)
and hangs before its first heartbeat of the attempt, as a rank waiting for a peer that
never comes would.
"""

import json
import os
import sys
import time

import agentd
import agentd.inprocess as inprocess

out = sys.argv[1]
hang_on_resume = "--hang-on-resume" in sys.argv[2:]
rank = int(os.environ["LOCAL_RANK"])


def note(name: str, doc: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as fp:
        json.dump(doc, fp)
    os.replace(path + ".tmp", path)


def others_stepped() -> bool:
    ranks = range(int(os.environ["LOCAL_WORLD_SIZE"]))
    return all(os.path.exists(os.path.join(out, f"step5_0_{r}")) for r in ranks if r != rank)


def train() -> None:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if hang_on_resume and inprocess.current().count:
        note(f"resumed_{rank}", {"pid": os.getpid()})
        time.sleep(3600)
    step = 0
    while True:
        time.sleep(0.01)
        step += 1
        agentd.heartbeat()
        if attempt == 0 and rank == 1 and step >= 30 and others_stepped():
            os._exit(3)
        if step == 5:
            note(f"step5_{attempt}_{rank}", {"pid": os.getpid()})
        if agentd.checkpoint_requested():
            note(f"ckpt_{rank}", {"step": step, "pid": os.getpid(), "attempt": attempt})
            agentd.checkpoint_saved()


inprocess.run(train)
