"""A gloo job that restarts in process: ``torch_inprocess.py OUT_DIR STEPS [CRASH_STEP]``.

Four ranks train a linear model on data fixed by (rank, step); with CRASH_STEP, rank 2
dies at that step of attempt 0, before its all-reduce, and rank 3 drifts (its weights
change) before it syncs again: it must get rank 0's. Before it dies, rank 2 writes
``crash.json``: the time (since boot), and the pid of the standby worker of its slot,
which it first waits for (up to 30 s) where ``TEST_WAIT_STANDBY`` is set (``cuda``: until
its CUDA is ready; then also the GPU memory it holds, in MiB). With ``TEST_HANG`` set, rank
2 hangs there instead (it stops itself with SIGSTOP, alive with its connections open, as a
rank stuck in native code is), and every rank heartbeats each step, so the agent finds
it. Each process writes ``rank<R>.<pid>.json`` at the end: its pid, the training
function's calls, the restart it saw, the step its last call resumed at, how its last
``sync()`` handed state over, the model's weights and, with the model on a GPU
(``TEST_DEVICE=cuda``, with ``TEST_BALLAST_MB`` more MiB held there, as a real model's
would be), the CUDA memory its allocator held at the end of each call.
"""

import json
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist

import agentd
import agentd.inprocess as inprocess

out, steps = sys.argv[1], int(sys.argv[2])
crash = int(sys.argv[3]) if len(sys.argv) > 3 else -1
hang = bool(os.environ.get("TEST_HANG"))
device = torch.device(os.environ.get("TEST_DEVICE", "cpu"))
torch.manual_seed(1234 + int(os.environ["RANK"]))  # every rank starts different: sync() must fix it
model = torch.nn.Linear(4, 1).to(device)
ballast = torch.ones(int(os.environ.get("TEST_BALLAST_MB", "0")) * 2**18, device=device)
allocated: list[int] = []
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # state to hand over
state = {"step": 0, "calls": 0, "resumed": 0}
true_w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], device=device)


def since_boot() -> float:
    """Seconds since the machine booted, as the kernel counts a process's start."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started() -> float:
    """When this process started, in seconds since boot (``/proc/self/stat``, in clock
    ticks: 10 ms here, finer than ``psutil``'s wall-clock figure, whose boot time is
    rounded to the second)."""
    with open("/proc/self/stat") as fp:
        fields = fp.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def own_standby(patience: float, cuda: bool = False) -> int | None:
    """The pid of the standby worker the zygote (our parent) keeps for our local rank
    (``cuda``: once its title says its CUDA is ready)."""
    import psutil  # here: imported before torch, it would turn --preload auto off

    ready = r" \(cuda:\d+ ready\)" if cuda else r"( \(cuda:\d+ ready\))?"
    title = re.compile(
        rf"agentd: standby worker {os.environ['LOCAL_RANK']} of zygote {os.getppid()}{ready}"
    )
    deadline = time.monotonic() + patience
    while True:
        for child in psutil.Process(os.getppid()).children():
            try:
                if title.fullmatch(child.cmdline()[0]):
                    return child.pid
            except (psutil.Error, IndexError):
                continue
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def gpu_mib(pid: int | None) -> int | None:
    """The GPU memory ``pid`` holds, in MiB, as nvidia-smi lists it (None: not listed)."""
    import subprocess

    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    held = [line.split(",") for line in listed.splitlines() if "," in line]
    return next((int(mib) for p, mib in held if p.strip() == str(pid)), None)


def train() -> None:
    state["calls"] += 1
    if device.type == "cuda":  # what this process holds as the call starts
        allocated.append(torch.cuda.memory_allocated())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if state["calls"] == 1 and inprocess.current().source is None:  # a fresh job: agree
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    if state["calls"] == 2 and rank == 3:  # a survivor that drifted: sync() must see it
        model.weight.data += 1.0
    assert inprocess.sync(model, optimizer) == (state["calls"] > 1 or not inprocess.current().fresh)
    state["step"] = state["resumed"] = inprocess.sync_object(state["step"])
    while state["step"] < steps:
        step = state["step"]
        if step == crash and rank == 2 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            wait = os.environ.get("TEST_WAIT_STANDBY", "")
            standby = own_standby(30.0 if wait else 0.0, cuda=wait == "cuda")
            held = gpu_mib(standby) if wait == "cuda" else None
            with open(os.path.join(out, "crash.json"), "w") as fp:
                json.dump({"since_boot": since_boot(), "standby": standby, "mib": held}, fp)
            if hang:
                os.kill(os.getpid(), signal.SIGSTOP)  # never continued: the agent kills it
            os._exit(1)
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step * 100 + rank))
        x = x.to(device)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        state["step"] = step + 1
        if hang:
            agentd.heartbeat()
    dist.barrier()
    dist.destroy_process_group()


inprocess.run(train)
report = {
    "rank": int(os.environ["RANK"]),
    "pid": os.getpid(),
    "started": started(),
    "calls": state["calls"],
    "resumed": state["resumed"],
    "restart": inprocess.current().count,
    "teardown_s": inprocess.current().teardown_s,
    "synced": getattr(inprocess.last_sync(), "route", None),
    "restart_count": os.environ["TORCHELASTIC_RESTART_COUNT"],
    "weights": [round(v, 6) for v in torch.cat([p.flatten() for p in model.parameters()]).tolist()],
    "allocated": allocated,
}
with open(os.path.join(out, f"rank{report['rank']}.{report['pid']}.json"), "w") as fp:
    json.dump(report, fp)
