"""A real job's recovery: crash -> every worker of the next attempt past its first all-reduce.

    python bench/bench_recovery.py [--runs 5] [--nproc 4]
        [--launchers agentd-preload,agentd,torchrun]

Each run starts one launcher with NPROC gloo workers (``recovery_worker.py``: they import
torch, join the process group and all-reduce); rank 0 crashes once all are past the
all-reduce, and the figure is the time from its crash to the last worker of the next
attempt past its all-reduce. ``agentd-preload`` forks the workers from a zygote that
imported torch (``--preload torch``). Prints median/min/max per launcher and the ratios;
a run that does not recover within the timeout is counted as failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = str(Path(__file__).with_name("recovery_worker.py"))
COMMANDS = {
    "agentd-preload": [sys.executable, "-m", "agentd", "run", "--preload", "torch"],
    "agentd": [sys.executable, "-m", "agentd", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def run_once(cmd: list[str], nproc: int, timeout: float) -> float | None:
    """Seconds from the crash to the last worker of attempt 1 past its all-reduce (None:
    the job did not recover)."""
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        argv = [*cmd, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "1",
                WORKER, tmp]  # fmt: skip
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
        out = Path(tmp)
        past = [out / f"past_1_{rank}" for rank in range(nproc)]
        if code != 0 or not (out / "crash").exists() or not all(p.exists() for p in past):
            return None  # the agent has exited: every report written is whole (renamed)
        crash = float((out / "crash").read_text())
        return max(float(p.read_text()) for p in past) - crash


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--launchers", default="agentd-preload,agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        sys.exit("bench_recovery needs torch (pip install torch==2.13.0)")
    print(f"crash -> all {args.nproc} workers of the next attempt past their first all-reduce "
          f"(gloo, {args.runs} runs, {os.cpu_count()} CPUs)")  # fmt: skip
    medians: dict[str, float] = {}
    for name in args.launchers.split(","):
        times = [run_once(COMMANDS[name], args.nproc, args.timeout) for _ in range(args.runs)]
        ok = [t for t in times if t is not None]
        line = f"  {name:<14} recovered {len(ok)}/{args.runs}"
        if ok:
            medians[name] = statistics.median(ok)
            line += (f"  median {medians[name] * 1000:7.0f} ms  min {min(ok) * 1000:7.0f}"
                     f"  max {max(ok) * 1000:7.0f}")  # fmt: skip
        print(line, flush=True)
    for faster in ("agentd-preload", "agentd"):
        for slower in ("agentd", "torchrun"):
            if faster != slower and faster in medians and slower in medians:
                print(f"  ratio {slower}/{faster} = {medians[slower] / medians[faster]:.1f}x")


if __name__ == "__main__":
    main()
