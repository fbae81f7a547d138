"""The job of bench/bench_chaos.py: gloo training that checkpoints, resumes and uses every
worker-side feature agentd has, as one script.

    chaos_worker.py OUT STEPS

Every rank fits ``y = x @ [2, -3] + 0.5`` by gradient descent, its gradients averaged by an
all-reduce each step; rank 0's parameters and step are broadcast at the start, read from
``OUT/ckpt.json`` where an earlier attempt saved them. Each step runs under torch's
``FileTimerClient`` (where the agent gives a timer file), heartbeats to agentd, and saves
every 10 steps and whenever a drain asks. Rank 0 writes ``OUT/done.json`` at the end;
it notes each step it finished in ``OUT/progress``, and each attempt's start in
``OUT/starts.jsonl`` (the step resumed at, the furthest step reached before it). With
``CHAOS_INPROCESS=1`` it trains in ``agentd.inprocess.run``, and a restart resumes from
the state of the ranks that kept their process where any did. Each step computes (sleeps)
50 ms in ``agentd.section("compute")``, which the job-wide straggler comparison times, and
``CHAOS_SLOWER`` times as long while the file ``CHAOS_SLOW_FLAG`` names is there (the
bench's ``node_slow``: its agent's environment gives each node its own).
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from report_files import write_report  # bench/ is the script's folder: sys.path[0]
from torch.distributed.elastic.timer import FileTimerClient, configure, expires

import agentd
import agentd.inprocess as inprocess

OUT, STEPS = sys.argv[1], int(sys.argv[2])
CKPT = os.path.join(OUT, "ckpt.json")
PROGRESS = os.path.join(OUT, "progress")
TRUE = torch.tensor([2.0, -3.0])
LR = 0.05
INPROCESS = os.environ.get("CHAOS_INPROCESS") == "1"
"""Train in ``agentd.inprocess.run``: the ranks that did not fail keep their process."""
COMPUTE = 0.05
SLOW_FLAG = os.environ.get("CHAOS_SLOW_FLAG", "")
SLOWER = float(os.environ.get("CHAOS_SLOWER", "1"))


def compute() -> None:
    """A step's compute: 50 ms, ``SLOWER`` times as long while this node is slowed."""
    with agentd.section("compute"):
        time.sleep(COMPUTE * (SLOWER if SLOW_FLAG and os.path.exists(SLOW_FLAG) else 1))


def write(path: str, doc: object) -> None:
    write_report(path, json.dumps(doc))


def resumed() -> torch.Tensor:
    """[step, w0, w1, b] from the checkpoint (zeros without one)."""
    try:
        with open(CKPT) as fp:
            doc = json.load(fp)
    except FileNotFoundError:
        return torch.zeros(4)
    return torch.tensor([float(doc["step"]), *doc["w"], doc["b"]])


PARAMS = torch.zeros(3)
"""w0, w1, b: kept across an in-process restart."""
STATE = {"step": 0}


def resume(rank: int) -> None:
    """Every rank takes rank 0's checkpoint (none: the start), unless a rank that kept its
    process hands its state over (``CHAOS_INPROCESS``)."""
    if not (INPROCESS and inprocess.sync(PARAMS)):
        state = resumed() if rank == 0 else torch.zeros(4)
        dist.broadcast(state, 0)
        STATE["step"], PARAMS[:] = int(state[0].item()), state[1:]
    if INPROCESS:
        STATE["step"] = inprocess.sync_object(STATE["step"])


def train() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("TORCHELASTIC_TIMER_FILE"):
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    resume(rank)
    start, params = STATE["step"], PARAMS
    if rank == 0:
        try:
            with open(PROGRESS) as fp:
                reached = int(fp.read())
        except FileNotFoundError:
            reached = 0
        with open(os.path.join(OUT, "starts.jsonl"), "a") as fp:
            note = {"step": start, "reached": reached, "world": world, "pid": os.getpid()}
            fp.write(json.dumps(note) + "\n")
    for step in range(start, STEPS):
        with expires(after=20, scope="step"):
            generator = torch.Generator().manual_seed(step * 1000 + rank)
            x = torch.randn(64, 2, generator=generator)
            y = x @ TRUE + 0.5
            error = x @ params[:2] + params[2] - y
            grad = torch.cat([2 * x.T @ error / 64, (2 * error.mean()).reshape(1)])
            dist.all_reduce(grad)
            params -= LR * grad / world
            STATE["step"] = step + 1
        agentd.heartbeat()
        asked = agentd.checkpoint_requested()
        if (asked or (step + 1) % 10 == 0) and rank == 0:
            write(CKPT, {"step": step + 1, "w": params[:2].tolist(), "b": params[2].item()})
        if asked:
            agentd.checkpoint_saved()
        if rank == 0:
            write(PROGRESS, step + 1)
        compute()
    agentd.end_heartbeats()
    if rank == 0:
        write(os.path.join(OUT, "done.json"), {"steps": STEPS, "w": params.tolist()})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    inprocess.run(train) if INPROCESS else train()
