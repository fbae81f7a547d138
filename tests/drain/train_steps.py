"""A job that counts steps and checkpoints when a drain asks (the drain tests' worker).

``train_steps.py OUT_DIR STOP_FILE``: every rank resumes from the newest checkpoint in
OUT_DIR (``ckpt_<rank>`` holds the step), steps every 10 ms, calls agentd.heartbeat(), and
on agentd.checkpoint_requested() saves and confirms. The ranks step in lockstep, as ranks
joined by collectives do: no rank starts a step before every rank has finished the last
one (through ``steps_<round>/<rank>`` files, a round known by its MASTER_PORT). That is
the job a drain's promise is made for: every rank checkpoints at the same step. With
``TEST_AGENTD_COMPUTE=SECONDS`` each step computes (sleeps) that long in
``agentd.section("compute")``, times ``TEST_AGENTD_SLOW`` (1: a node as fast as the others)
on the node whose agent has it in its environment. With ``TEST_AGENTD_FAIL_AFTER_SAVE``,
a rank exits 1 right after it saved (as a collective fails once a drained node's ranks
are gone); with ``TEST_AGENTD_FAIL_ON_PEER_EXIT``, a rank stopped by SIGTERM says so as it
goes, and the others exit 1 as they see it; the stopped rank exits only once their agents
have reaped them (up to 20 s), so its agent's leave reaches theirs after their workers'
failure, as a real peer's loss does. With ``TEST_AGENTD_SAVE_SECONDS``, a rank takes that
long to save (its drain stays open meanwhile). It notes each start
(``start_<attempt>_<rank>``: world size and the step it resumed at) and exits 0 once
STOP_FILE exists.
"""

import json
import os
import signal
import sys
import time

import agentd

out, stop = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
attempt = os.environ["AGENTD_ATTEMPT"]
host = os.environ.get("TEST_AGENTD_HOST", "")


def write(name: str, doc: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as fp:
        json.dump(doc, fp)
    os.replace(path + ".tmp", path)


def read(name: str) -> dict:
    with open(os.path.join(out, name)) as fp:
        return json.load(fp)


lockstep = os.path.join(out, f"steps_{host}{os.environ['MASTER_PORT']}")
compute = float(os.environ.get("TEST_AGENTD_COMPUTE", "0")) * float(
    os.environ.get("TEST_AGENTD_SLOW", "1")
)
os.makedirs(lockstep, exist_ok=True)


def finished(step: int) -> None:
    path = os.path.join(lockstep, str(rank))
    with open(path + ".tmp", "w") as fp:
        fp.write(str(step))
    os.replace(path + ".tmp", path)


def finished_by(peer: int) -> int:
    try:
        with open(os.path.join(lockstep, str(peer))) as fp:
            return int(fp.read())
    except FileNotFoundError:
        return -1


def wait_for_every_rank(step: int) -> None:
    """Return once every rank has finished ``step`` (or the job is stopping)."""
    while not os.path.exists(stop):
        if all(finished_by(peer) >= step for peer in range(world)):
            return
        if peer_exits and any(n.startswith("stopped_") for n in os.listdir(peer_exits)):
            failed = os.path.join(peer_exits, f"failed_{rank}")
            with open(failed + ".tmp", "w") as fp:
                fp.write(str(os.getpid()))
            os.replace(failed + ".tmp", failed)
            sys.exit(1)  # as a collective fails once a peer's process is gone
        time.sleep(0.003)


peer_exits = ""
if os.environ.get("TEST_AGENTD_FAIL_ON_PEER_EXIT"):
    peer_exits = os.path.join(lockstep, "exits")
    os.makedirs(peer_exits, exist_ok=True)

    def reaped(peer: int) -> bool:
        try:
            with open(os.path.join(peer_exits, f"failed_{peer}")) as fp:
                pid = int(fp.read())
        except FileNotFoundError:
            return False
        try:
            os.kill(pid, 0)  # a zombie still answers: its agent has not seen it exit
        except ProcessLookupError:
            return True
        return False

    def leave(*_: object) -> None:
        open(os.path.join(peer_exits, f"stopped_{rank}"), "w").close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            reaped(peer) for peer in range(world) if peer != rank
        ):
            time.sleep(0.005)
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)


saved = [read(n) for n in os.listdir(out) if n.startswith("ckpt_") and not n.endswith(".tmp")]
step = max((s["step"] for s in saved), default=0)
write(f"start_{host}{attempt}_{rank}", {"world": world, "resumed_at": step})
finished(step)
while not os.path.exists(stop):
    wait_for_every_rank(step)
    if compute:
        with agentd.section("compute"):
            time.sleep(compute)
    else:
        time.sleep(0.01)
    step += 1
    agentd.heartbeat()
    if agentd.checkpoint_requested():
        write(f"ckpt_{host}{attempt}_{rank}", {"step": step, "at": time.time(), "world": world})
        time.sleep(float(os.environ.get("TEST_AGENTD_SAVE_SECONDS", "0")))
        agentd.checkpoint_saved()
        if os.environ.get("TEST_AGENTD_FAIL_AFTER_SAVE"):
            sys.exit(1)  # as a collective fails once the drained node's ranks are gone
    finished(step)
