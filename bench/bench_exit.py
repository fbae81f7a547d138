"""How long a launcher holds its exit once the job's workers are done, agentd beside
torchrun in the same run.

    python bench/bench_exit.py [--runs 5] [--launchers agentd,torchrun] [--record]

Each run is ``--standalone --nproc-per-node 2 exit_worker.py`` (a gloo all-reduce); each
rank stamps the wall time when its code was done, and the figure is the launcher's exit
after the last stamp: the workers' exit (their exit functions and interpreter teardown)
and the launcher's end (its exit barrier, its helpers stopped: agentd's zygote among
them). Prints the median, min and max per launcher, and the ratio torchrun/agentd;
``--record`` stores the medians in docs/figures.json (``job_exit_<launcher>``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = str(Path(__file__).with_name("exit_worker.py"))
LAUNCHERS = {
    "agentd": [sys.executable, "-m", "agentd", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def one(launcher: list[str], timeout: float) -> float:
    """Seconds from the last rank's stamp to the launcher's exit (SystemExit on a failed job)."""
    with tempfile.TemporaryDirectory(prefix="bench-exit-") as stamps:
        env = {**os.environ, "BENCH_EXIT_STAMPS": stamps, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [*launcher, "--standalone", "--nproc-per-node", "2", WORKER],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        ended = time.time()
        if done.returncode != 0:
            sys.exit(f"{launcher[2]}: exit {done.returncode}\n{done.stderr[-2000:]}")
        last = max(float(Path(stamps, rank).read_text()) for rank in ("0", "1"))
        return ended - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    parser.add_argument("--record", action="store_true", help="store the medians in the docs")
    args = parser.parse_args()
    if args.runs < 1:
        sys.exit(f"--runs: {args.runs} must be >= 1")
    names = [name.strip() for name in args.launchers.split(",") if name.strip()]
    if unknown := set(names) - set(LAUNCHERS):
        sys.exit(f"--launchers: unknown {sorted(unknown)}, expected some of {sorted(LAUNCHERS)}")
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.runs):  # alternated, so a slow minute of the machine costs both
        for name in names:
            seconds[name].append(one(LAUNCHERS[name], args.timeout))
    print(f"{args.runs} jobs per launcher: the last worker done -> the launcher's exit")
    print(f"{'launcher':<10} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in seconds.items():
        print(
            f"{name:<10} {statistics.median(values):>9.3f} {min(values):>7.3f} {max(values):>7.3f}"
        )
    if {"agentd", "torchrun"} <= set(seconds):
        ratio = statistics.median(seconds["torchrun"]) / statistics.median(seconds["agentd"])
        print(f"torchrun/agentd: {ratio:.1f}x")
    if args.record:
        from figures import record

        command = f".venv/bin/python bench/bench_exit.py --runs {args.runs} --record"
        for name, values in seconds.items():
            note = f"median of {args.runs}, from the last rank's code done to the launcher's exit"
            record(f"job_exit_{name}", f"{statistics.median(values):.2f} s", command, note)


if __name__ == "__main__":
    main()
