"""A job that restarts in process, without torch: ``inprocess_job.py OUT MODE``.

In ``nodes`` mode (several agents) every rank loops until ``OUT/release`` exists and
reports to ``$TEST_AGENTD_OUT`` (one folder per agent) instead of OUT.

Local rank 1 dies on attempt 0 once every rank has reported (in ``hang`` mode it hangs
under a 0.3 s expiration timer instead, and the watchdog reaps it; in ``raise`` mode its
training function raises ValueError; in ``raise-always`` mode it raises on every attempt
while the others wait to be parked; in ``slow-exit`` mode it dies as a process holding a
CUDA context does: its descriptors close at once, its exit comes 1.5 s later, and the
others' training functions raise as their collectives with it would). The others, on
attempt 0: ``loop`` in Python (a park interrupts them at once), ``stuck`` in one long
native sleep (they cannot park in time; ``stuck-one``: local rank 0 alone, after one
heartbeat, the others loop), ``garbage`` write a line the agent does not understand on
their channel, then loop. Every call of the training function appends a JSON line to
``OUT/rank<LOCAL_RANK>.jsonl``; on later attempts it returns (in ``loop`` mode once
``OUT/release`` exists). SIGUSR1 makes any rank close its channel and linger, as a process
on its way out does. While ``OUT/hold`` exists, later attempts keep running in any mode.
In ``undestroyable`` mode (``loop`` otherwise), local rank 2's process
group cannot be destroyed when it parks (a stand-in for ``torch.distributed`` raises), and
attempt 1 returns at once. In ``hang-in-stop`` mode every rank heartbeats as it loops;
local rank 0 goes silent in one long native sleep as rank 1 dies, so that the agent finds
it hung only while the others park; attempt 1 returns at once. In ``hang-resumed`` mode
(``loop`` on attempt 0) every rank heartbeats on attempt 1, and local rank 0, kept, goes
silent in one long native sleep after a second; attempt 2 returns at once.
"""

import json
import os
import signal
import socket
import sys
import time
import types
from collections.abc import Callable

import agentd
import agentd.inprocess as inprocess

shared, mode = sys.argv[1], sys.argv[2]


def on_its_way_out(*_: object) -> None:
    """SIGUSR1: close the channel, as a process whose exit has begun does, and linger."""
    channel = socket.socket(fileno=int(os.environ["AGENTD_INPROCESS_FD"]))
    channel.shutdown(socket.SHUT_RDWR)
    time.sleep(30)  # the agent stops it


signal.signal(signal.SIGUSR1, on_its_way_out)
out = os.environ["TEST_AGENTD_OUT"] if mode == "nodes" else shared
rank = int(os.environ["LOCAL_RANK"])


def wedged_torch_distributed() -> types.ModuleType:
    """A stand-in for an initialised ``torch.distributed`` whose group cannot be destroyed."""

    def destroy_process_group() -> None:
        raise RuntimeError("the group is wedged")

    fake = types.ModuleType("torch.distributed")
    fake.__dict__.update(
        is_available=lambda: True,
        is_initialized=lambda: True,
        is_nccl_available=lambda: False,
        distributed_c10d=types.SimpleNamespace(_world=None),
        group=types.SimpleNamespace(WORLD=None),
        destroy_process_group=destroy_process_group,
    )
    return fake


def released() -> bool:
    return os.path.exists(os.path.join(shared, "release"))


def held() -> bool:
    """``OUT/hold`` keeps a later attempt running, whatever the mode, until it is gone."""
    return os.path.exists(os.path.join(shared, "hold"))


def calls(path: str) -> int:
    """How many calls of the training function the file records."""
    try:
        with open(path) as fp:
            return sum(1 for _ in fp)
    except FileNotFoundError:
        return 0


def heartbeat_while(going: Callable[[], bool]) -> None:
    """Heartbeat every 10 ms while ``going()``."""
    while going():
        agentd.heartbeat()
        time.sleep(0.01)


def reported() -> int:
    """How many ranks called the training function so far."""
    return len([n for n in os.listdir(out) if n.endswith(".jsonl")])


def train() -> None:
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    restart = inprocess.current()
    line = {
        "pid": os.getpid(),
        "attempt": attempt,
        "rank": int(os.environ["RANK"]),
        "count": restart.count,
        "replaced": list(restart.replaced),
        "source": restart.source,
        "fresh": restart.fresh,
        "channel": "AGENTD_INPROCESS_FD" in os.environ,
    }
    with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as fp:
        fp.write(json.dumps(line) + "\n")
    if mode == "raise-always":
        while rank == 1 and not all(  # every rank is in this attempt (opted in) too
            calls(os.path.join(out, f"rank{r}.jsonl")) > int(attempt)
            for r in range(int(os.environ["LOCAL_WORLD_SIZE"]))
        ):
            time.sleep(0.01)
        if rank == 1:
            raise ValueError("still NaN")
        while True:
            time.sleep(0.01)
    if mode == "hang-in-stop" and attempt == "0":
        silent = os.path.join(out, "silent")
        if rank == 0:  # once every rank beat a while, silent, where a park cannot reach it
            heartbeat_while(lambda: reported() < int(os.environ["LOCAL_WORLD_SIZE"]))
            until = time.monotonic() + 1.0
            heartbeat_while(lambda: time.monotonic() < until)
            with open(silent, "w"):
                pass
            time.sleep(60)
        heartbeat_while(lambda: rank == 2 or not os.path.exists(silent))
        os._exit(3)  # rank 1, as rank 0 goes silent
    if mode == "hang-resumed" and attempt != "0":
        if attempt == "1":
            until = time.monotonic() + 1.0
            heartbeat_while(lambda: rank != 0 or time.monotonic() < until)
            time.sleep(60)  # rank 0: silent, where a park cannot reach it
        return
    if mode == "nodes" or attempt != "0":
        while held() or (
            mode in ("loop", "hang", "nodes", "raise", "slow-exit") and not released()
        ):
            time.sleep(0.01)
        return
    if rank == 1:
        while len([n for n in os.listdir(out) if n.endswith(".jsonl")]) < int(
            os.environ["LOCAL_WORLD_SIZE"]
        ):
            time.sleep(0.01)
        if mode == "raise":
            raise ValueError("loss is NaN at step 7")
        if mode == "slow-exit":
            channel = socket.socket(fileno=int(os.environ["AGENTD_INPROCESS_FD"]))
            channel.shutdown(socket.SHUT_RDWR)  # wakes the reader thread blocked on it
            os.closerange(0, 1024)  # the channel, the pipes: what the kernel closes first
            with open(os.path.join(out, "dying"), "w"):  # the peers' sockets close
                pass
            time.sleep(1.0)  # a CUDA context's teardown: up to a second, within DYING_WAIT (2 s)
        if mode == "hang":
            from agentd.timer import expires

            with expires(after=0.3):
                time.sleep(30)
        os._exit(3)
    if mode == "undestroyable" and rank == 2:
        sys.modules["torch.distributed"] = wedged_torch_distributed()
    if mode == "garbage":
        os.write(int(os.environ["AGENTD_INPROCESS_FD"]), b"not json\n")
    if mode == "stuck" or (mode == "stuck-one" and rank == 0):
        if mode == "stuck-one":
            agentd.heartbeat()  # registers its stack dump: the agent says where it is stuck
        time.sleep(30)
    if mode == "slow-exit":
        while not os.path.exists(os.path.join(out, "dying")):
            time.sleep(0.01)
        time.sleep(0.1)  # the collective's error comes after the close it reports
        raise RuntimeError("Connection closed by peer")  # what gloo says
    while True:
        time.sleep(0.01)


inprocess.run(train)
