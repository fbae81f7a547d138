"""Time to first step of a multi-node job: N agents on this machine, one worker each.

    python bench/bench_first_step.py [--runs 3] [--agents 4]
        [--launchers agentd,agentd-spawn,torchrun]

Each run starts AGENTS launchers at once as the nodes of one ``--nnodes AGENTS`` job over
127.0.0.1 with torchrun's command line (``--rdzv-backend c10d``; the first launcher hosts
the store), one gloo worker each (``recovery_worker.py``: it imports torch, joins the
process group and all-reduces). The figure is the time from the start of the launchers to
the last worker past its first all-reduce. ``agentd`` has no flags (a zygote preloads
torch on every node, overlapping the rendezvous), ``agentd-spawn`` spawns each worker
(``--no-preload``). The launchers take turns, run by run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_control import end_run, wait_for

WORKER = str(Path(__file__).with_name("recovery_worker.py"))
MARK_ENV = "BENCH_FIRST_STEP_RUN"
COMMANDS = {
    "agentd": [sys.executable, "-m", "agentd", "run"],
    "agentd-spawn": [sys.executable, "-m", "agentd", "run", "--no-preload"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_once(name: str, agents: int, timeout: float) -> float | str:
    """Seconds from the launch to every worker past its first all-reduce, or why not."""
    marker = os.urandom(6).hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "PET_"))}
    env.update({"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", MARK_ENV: marker})
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")])
    )
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-first-step-") as tmp:
        out = Path(tmp)
        argv = [
            *COMMANDS[name],
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-id",
            "job",
            "--nnodes",
            str(agents),
            "--nproc-per-node",
            "1",
            WORKER,
            tmp,
        ]
        began = time.time()
        try:
            for i in range(agents):
                log_path = out / f"launcher{i}.log"  # the launcher's output, for a look after
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
                        )
                    )
            past = [out / f"past_0_{rank}" for rank in range(agents)]
            if not wait_for(lambda: all(p.exists() for p in past), timeout):
                missing = [p.name for p in past if not p.exists()]
                return f"not past the first all-reduce within {timeout:g}s: {missing}"
            return max(float(p.read_text()) for p in past) - began
        finally:
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--launchers", default="agentd,agentd-spawn,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    names = args.launchers.split(",")
    if set(names) - set(COMMANDS):
        sys.exit(f"--launchers: known {', '.join(COMMANDS)}")
    print(
        f"{args.agents} agents x 1 gloo worker on this machine, launch -> every worker past "
        f"its first all-reduce ({args.runs} runs, {os.cpu_count()} CPUs)"
    )
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(args.runs):  # interleaved: a slow spell of the machine hits them all
        for name in names:
            took = run_once(name, args.agents, args.timeout)
            if isinstance(took, str):
                print(f"  {name}: run {run + 1}: {took}", flush=True)
            else:
                times[name].append(took)
    medians = {}
    for name in names:
        ok = times[name]
        line = f"  {name:<13} {len(ok)}/{args.runs}"
        if ok:
            medians[name] = statistics.median(ok)
            line += f"  median {medians[name]:6.2f} s  min {min(ok):6.2f}  max {max(ok):6.2f}"
        print(line, flush=True)
    if "torchrun" in medians:
        for name in names:
            if name in medians and name != "torchrun":
                print(f"  ratio torchrun/{name} = {medians['torchrun'] / medians[name]:.1f}x")


if __name__ == "__main__":
    main()
