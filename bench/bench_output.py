"""Tee'd worker output under ``-t 3``: lines, progress bars and output with no line end.

    python bench/bench_output.py [--mib 200] [--runs 3]

One worker writes MIB mebibytes to stdout; the launcher tees it to its log file and,
prefixed, to its console (here /dev/null). Prints, per launcher and kind of output, the
wall time from launch to exit, the launcher's own CPU time and its peak RSS (VmHWM, read
until it exits), and the ratio of each kind to plain lines. torchrun runs too where torch
is installed. The target: output without newlines costs at most 2x lines, RSS <= 60 MiB.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORKER = str(Path(__file__).with_name("output_worker.py"))
KINDS = ("lines", "bar", "none")


def launchers() -> dict[str, list[str]]:
    found = {"agentd": [sys.executable, "-m", "agentd", "run"]}
    if importlib.util.find_spec("torch") is not None:
        found["torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    return found


def peak_rss(pid: int) -> int:
    """VmHWM of ``pid`` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fp:
            for line in fp:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_once(cmd: list[str], kind: str, mib: int, logs: Path) -> tuple[float, float, int]:
    """(wall seconds, launcher CPU seconds, launcher peak RSS bytes)."""
    argv = [
        *cmd,
        "--standalone",
        "--nproc-per-node",
        "1",
        "--log-dir",
        str(logs),
        "-t",
        "3",
        WORKER,
        str(mib),
        kind,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    began = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    agent = psutil.Process(proc.pid)
    rss = cpu = 0.0
    while proc.poll() is None:
        try:
            times = agent.cpu_times()
            cpu = times.user + times.system
        except psutil.Error:
            break
        rss = max(rss, peak_rss(proc.pid))
        time.sleep(0.02)
    proc.wait()
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[-1]} {kind}: exit {proc.returncode}")
    return wall, cpu, int(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.mib} MiB from one worker under -t 3, {args.runs} runs each (medians)")
    print(
        f"{'launcher':<10} {'output':<7} {'wall s':>8} {'cpu s':>8} {'peak RSS':>10} "
        f"{'wall vs lines':>14}"
    )
    for name, cmd in launchers().items():
        base = None
        for kind in KINDS:
            samples = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as tmp:
                    samples.append(run_once(cmd, kind, args.mib, Path(tmp)))
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            rss = max(s[2] for s in samples) / 2**20
            base = base or wall
            print(
                f"{name:<10} {kind:<7} {wall:>8.2f} {cpu:>8.2f} {rss:>7.1f} MiB "
                f"{wall / base:>13.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
