"""Benchmark worker for bench_recovery.py's ``agentd-inprocess``: recovery_worker.py's job
with the training function wrapped in :func:`agentd.inprocess.run`.

``recovery_inprocess_worker.py OUT_DIR``. Each call of the training function joins the
process group, hands the survivors' model to a new rank (:func:`agentd.inprocess.sync`),
all-reduces, and writes ``past_<restart>_<rank>`` (epoch seconds) and
``phases_<restart>_<rank>`` (when it started, built its model, joined the group, had
its state and was past the all-reduce), ``route_<restart>_<rank>`` (the route its state
took, where it was handed any), ``state_<restart>_<rank>`` (its pid, the model's
checksum and, on a GPU, the CUDA memory its allocator holds). On the first attempt, rank 0
writes ``crash`` and exits 1 once every rank is past its all-reduce; the others wait in
their next collective, which fails as rank 0 dies. ``BENCH_MODEL_MB`` sets the model's
size (default 1), ``BENCH_DEVICE`` where it lives (default cpu; collectives stay gloo).
With ``BENCH_STANDBY_WAIT`` (``1``, or ``cuda`` for a standby whose CUDA is ready), rank 0
first waits for the standby worker of its slot, as a job that fails after its start
finds it (up to 20 s; it crashes anyway after that, and says so).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from report_files import write_report

import agentd.inprocess as inprocess

out = sys.argv[1]
phases = {"started": time.time()}
torch.manual_seed(int(os.environ["RANK"]))  # differs per rank: only sync() makes them agree
side = int((float(os.environ.get("BENCH_MODEL_MB", "1")) * 2**20 / 4) ** 0.5)
device = os.environ.get("BENCH_DEVICE", "cpu")
model = torch.nn.Linear(side, side, device=device)  # the survivors keep it: no checkpoint read
phases["model built"] = time.time()


def wait_for_standby(kind: str) -> None:
    """Until the zygote (our parent) holds the standby of our slot (``cuda``: with its
    CUDA ready); nothing for ``''``."""
    if not kind:
        return
    import psutil  # here: imported before torch, it would turn --preload auto off

    title = f"agentd: standby worker {os.environ['LOCAL_RANK']} of zygote {os.getppid()}"
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        for child in psutil.Process(os.getppid()).children():
            try:
                shown = child.cmdline()[0]
            except (psutil.Error, IndexError):
                continue
            if shown.startswith(title) and (kind != "cuda" or shown.endswith("ready)")):
                return
        time.sleep(0.02)
    print(f"no standby ({kind}) after 20 s: crashing without one", file=sys.stderr, flush=True)


def train() -> None:
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    dist.init_process_group("gloo")
    phases["group joined"] = time.time()
    rank = dist.get_rank()
    if restart == "0":
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    inprocess.sync(model)
    phases["state synced"] = time.time()
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    phases["past all-reduce"] = time.time()
    write_report(os.path.join(out, f"past_{restart}_{rank}"), repr(phases["past all-reduce"]))
    write_report(os.path.join(out, f"phases_{restart}_{rank}"), json.dumps(phases))
    if inprocess.last_sync() is not None:
        write_report(os.path.join(out, f"route_{restart}_{rank}"), inprocess.last_sync().route)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    state = {"pid": os.getpid(), "checksum": checksum}
    if device != "cpu":
        state["cuda_allocated"] = torch.cuda.memory_allocated()
    write_report(os.path.join(out, f"state_{restart}_{rank}"), json.dumps(state))
    if restart == "0":
        dist.barrier()
        if rank == 0:
            wait_for_standby(os.environ.get("BENCH_STANDBY_WAIT", ""))
            write_report(os.path.join(out, "crash"), repr(time.time()))
            os._exit(1)
        dist.barrier()  # fails as rank 0 dies; the agent parks us
    dist.barrier()
    dist.destroy_process_group()


inprocess.run(train)
