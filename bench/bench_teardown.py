"""Two-agent gloo jobs that succeed must be reported as succeeded, every time.

    python bench/bench_teardown.py [--runs 50] [--launchers agentd,agentd-static,torchrun]

Runs RUNS consecutive jobs of 2 agents x 2 workers on loopback (``teardown_worker.py``:
init, all-reduce, barrier, destroy) under each launcher, and prints how many ended with
exit 0 on both agents, the median wall time of a job, and the first lines of a failure.

Launchers:
  agentd          ``--rdzv-backend c10d``: the agent of group rank 0 serves the workers'
                  store, which outlives every worker (TORCHELASTIC_USE_AGENT_STORE=True).
  agentd-static   ``--rdzv-backend static``: node 0's agent serves the job's store for
                  the whole job, as torchrun's static agents do (until 2026-12-01, rank
                  0's *worker* hosted it: the control that showed the cause).
  torchrun        ``torch.distributed.run --rdzv-backend c10d`` (where torch is installed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_control import tally

WORKER = str(Path(__file__).with_name("teardown_worker.py"))
AGENTD = [sys.executable, "-m", "agentd", "run"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_commands(launcher: str, run: int, logs: Path) -> list[list[str]]:
    """The two agents' command lines for one job."""
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2"]
    if launcher == "agentd-static":
        return [
            [
                *AGENTD,
                *common,
                "--rdzv-backend",
                "static",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--log-dir",
                str(logs / f"n{node}"),
                WORKER,
            ]
            for node in (0, 1)
        ]
    cmd = AGENTD if launcher == "agentd" else TORCHRUN
    extra = ["--log-dir", str(logs)] if launcher == "agentd" else []
    return [
        [
            *cmd,
            *common,
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"teardown{run}",
            *extra,
            WORKER,
        ]
        for _ in (0, 1)
    ]


def run_job(commands: list[list[str]], timeout: float) -> tuple[bool, float, str]:
    """(both agents exited 0, wall seconds, else the exit codes and the tail of a failing
    agent's stderr)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for cmd in commands
    ]
    codes, errors = [], []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += f"\n(killed after {timeout:g} s)"
        codes.append(proc.returncode)
        errors.append(err)
    wall = time.monotonic() - began
    failed = [err for code, err in zip(codes, errors, strict=True) if code != 0]
    if not failed:
        return True, wall, ""
    return False, wall, f"exit codes {codes}\n" + "\n".join(failed[0].strip().splitlines()[-4:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--launchers", default="agentd,agentd-static,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("bench_teardown needs torch (pip install torch==2.13.0)")
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    unknown = set(launchers) - {"agentd", "agentd-static", "torchrun"}
    if unknown:
        sys.exit(f"--launchers: unknown {sorted(unknown)}")
    print(f"{args.runs} consecutive jobs of 2 agents x 2 gloo workers per launcher")
    print(f"{'launcher':<14} {'succeeded':>10} {'median s':>9}")
    with tempfile.TemporaryDirectory(prefix="bench-teardown-") as tmp:
        for launcher in launchers:
            tally(
                launcher,
                args.runs,
                lambda run, name=launcher: run_job(
                    agent_commands(name, run, Path(tmp, name, str(run))), args.timeout
                ),
            )


if __name__ == "__main__":
    main()
