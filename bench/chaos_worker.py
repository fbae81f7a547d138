"""The job of bench/bench_chaos.py: gloo training that checkpoints, resumes and uses every
worker-side feature agentd has, as one script.

    chaos_worker.py OUT STEPS

Every rank fits ``y = x @ [2, -3] + 0.5`` by gradient descent, its gradients averaged by an
all-reduce each step; rank 0's parameters and step are broadcast at the start, read from
``OUT/ckpt.json`` where an earlier attempt saved them. Each step runs under torch's
``FileTimerClient`` (where the agent gives a timer file), heartbeats to agentd, and saves
every 10 steps and whenever a drain asks. Rank 0 writes ``OUT/done.json`` at the end;
it notes each step it finished in ``OUT/progress``, and each attempt's start in
``OUT/starts.jsonl`` (the step resumed at, the furthest step reached before it).
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.timer import FileTimerClient, configure, expires

import agentd

OUT, STEPS = sys.argv[1], int(sys.argv[2])
CKPT = os.path.join(OUT, "ckpt.json")
PROGRESS = os.path.join(OUT, "progress")
TRUE = torch.tensor([2.0, -3.0])
LR = 0.05


def write(path: str, doc: dict) -> None:
    with open(path + f".{os.getpid()}", "w") as fp:
        json.dump(doc, fp)
    os.replace(path + f".{os.getpid()}", path)


def resumed() -> torch.Tensor:
    """[step, w0, w1, b] from the checkpoint (zeros without one)."""
    try:
        with open(CKPT) as fp:
            doc = json.load(fp)
    except FileNotFoundError:
        return torch.zeros(4)
    return torch.tensor([float(doc["step"]), *doc["w"], doc["b"]])


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("TORCHELASTIC_TIMER_FILE"):
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    state = resumed() if rank == 0 else torch.zeros(4)
    dist.broadcast(state, 0)
    start, params = int(state[0].item()), state[1:].clone()
    if rank == 0:
        try:
            with open(PROGRESS) as fp:
                reached = int(fp.read())
        except FileNotFoundError:
            reached = 0
        with open(os.path.join(OUT, "starts.jsonl"), "a") as fp:
            note = {"step": start, "reached": reached, "world": world}
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
        agentd.heartbeat()
        asked = agentd.checkpoint_requested()
        if (asked or (step + 1) % 10 == 0) and rank == 0:
            write(CKPT, {"step": step + 1, "w": params[:2].tolist(), "b": params[2].item()})
        if asked:
            agentd.checkpoint_saved()
        if rank == 0:
            with open(PROGRESS + ".tmp", "w") as fp:
                fp.write(str(step + 1))
            os.replace(PROGRESS + ".tmp", PROGRESS)
        time.sleep(0.05)
    agentd.end_heartbeats()
    if rank == 0:
        write(os.path.join(OUT, "done.json"), {"steps": STEPS, "w": params.tolist()})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
